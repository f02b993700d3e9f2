#include "cli/numeric_option.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "core/escape.h"

namespace moecore::cli {

int64_t parse_int_option(const std::string& option, const std::string& text, int64_t min,
                         int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max)
    throw CLI::ValidationError(fmt::format("{}={} is not an integer in [{}, {}]", option,
                                           escape_for_message(text), min, max));
  return value;
}

double parse_float_option(const std::string& option, const std::string& text, double min,
                          double max, Ends ends) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) || value < min ||
      value > max || (ends == Ends::kNotMax && value == max) ||
      (ends == Ends::kNotMin && value == min))
    throw CLI::ValidationError(fmt::format(
        "{}={} is not a number in {}{}, {}{}", option, escape_for_message(text),
        ends == Ends::kNotMin ? "(" : "[", min, max, ends == Ends::kNotMax ? ")" : "]"));
  return value;
}

uint64_t parse_seed_option(const std::string& option, const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw CLI::ValidationError(
        fmt::format("{}={} is not an integer in [0, 2^64)", option, escape_for_message(text)));
  return value;
}

CLI::Option* add_int_option(CLI::App* app, const std::string& name, int64_t& value,
                            const std::string& help, int64_t min, int64_t max) {
  return app->add_option_function<std::string>(
      name,
      [&value, name, min, max](const std::string& text) {
        value = parse_int_option(name, text, min, max);
      },
      help);
}

CLI::Option* add_float_option(CLI::App* app, const std::string& name, double& value,
                              const std::string& help, double min, double max, Ends ends) {
  return app->add_option_function<std::string>(
      name,
      [&value, name, min, max, ends](const std::string& text) {
        value = parse_float_option(name, text, min, max, ends);
      },
      help);
}

CLI::Option* add_seed_option(CLI::App* app, const std::string& name, uint64_t& value,
                             const std::string& help) {
  return app->add_option_function<std::string>(
      name, [&value, name](const std::string& text) { value = parse_seed_option(name, text); },
      help);
}

}  // namespace moecore::cli
