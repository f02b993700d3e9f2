// Errors that reach the user. Every failure names the operation and the offending value, e.g.
// "[attention] num_attention_heads=3 does not divide hidden_size=64". The CLI catches
// moecore::Error, prints its one-line message and exits non-zero; nothing in the library calls
// exit().
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moecore {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moecore

// MOE_CHECK(cond, "[op] message {}", value): throws moecore::Error with the formatted message.
#define MOE_CHECK(cond, ...)        \
  do {                              \
    if (!(cond)) {                  \
      ::moecore::fail(__VA_ARGS__); \
    }                               \
  } while (0)
