// Untrusted bytes in messages. Every error is one line on stderr, and names, keys and values read
// from files are echoed into those lines: a tensor name holding "\r" or a config value holding a
// newline must not split the line, rewrite the terminal or smuggle a fake second message.
#pragma once

#include <string>
#include <string_view>

namespace moecore {

// `text` with every byte that could break or disguise a one-line message escaped: \n, \r, \t, other
// C0 controls and DEL as \xNN, and bytes that are not valid UTF-8 (or encode a C1 control, U+2028
// or U+2029) as \xNN per byte. Printable ASCII and valid printable UTF-8 pass unchanged, and so do
// backslashes: escaping twice changes nothing, so a message may be escaped where it is built and
// again where it is printed.
std::string escape_for_message(std::string_view text);

}  // namespace moecore
