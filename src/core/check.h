// Errors that reach the user. Every failure names the operation and the offending value, e.g.
// "[attention] num_attention_heads=3 does not divide hidden_size=64". The CLI catches
// moecore::Error, prints its one-line message and exits non-zero; nothing in the library calls
// exit(). Messages are escaped on construction (core/escape.h): whatever bytes a reader echoes
// into one, it stays one line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "core/escape.h"

namespace moecore {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(escape_for_message(message)) {}
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
