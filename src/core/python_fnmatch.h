// Python's fnmatch.fnmatchcase(name, pattern), the matching OLMo-core's optimizer group overrides
// use (fnmatch on POSIX, where it does not fold case): * (any run, '/' and a leading '.'
// included), ? (any one character), [seq] and [!seq] with ranges, no escape character. Written
// after fnmatch.translate rather than taken from the C library, whose fnmatch reads [^seq] as a
// negation and [[:digit:]] as a class where Python reads both literally.
#pragma once

#include <string_view>

namespace moecore {

bool python_fnmatch(std::string_view name, std::string_view pattern);

}  // namespace moecore
