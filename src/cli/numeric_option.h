// Numeric command-line options read strictly. CLI11's own conversion saturates integers beyond
// int64 (`--steps 99999999999999999999` became 2^63-1 and ran forever) and accepts nan/inf for
// floats, so these options are taken as text and parsed here: the whole text must be a number in
// the option's range, else parsing fails with one line naming the option, its value and the range.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace moecore::cli {

// Parses `text` as a decimal integer in [min, max]; throws CLI::ValidationError naming `option`.
int64_t parse_int_option(const std::string& option, const std::string& text, int64_t min,
                         int64_t max);
// Which ends of a float option's range it may take.
enum class Ends { kBoth, kNotMax, kNotMin };

// Parses `text` as a finite number in [min, max] ([min, max) for kNotMax, (min, max] for kNotMin);
// throws CLI::ValidationError naming `option` and the range.
double parse_float_option(const std::string& option, const std::string& text, double min,
                          double max, Ends ends = Ends::kBoth);
// Parses `text` as a decimal integer in [0, 2^64) (a seed); throws CLI::ValidationError naming
// `option`. A minus sign is refused, not wrapped around.
uint64_t parse_seed_option(const std::string& option, const std::string& text);

// Registers `name` (e.g. "--steps") on `app`, parsed by parse_int_option into `value`.
CLI::Option* add_int_option(CLI::App* app, const std::string& name, int64_t& value,
                            const std::string& help, int64_t min, int64_t max);
CLI::Option* add_float_option(CLI::App* app, const std::string& name, double& value,
                              const std::string& help, double min, double max,
                              Ends ends = Ends::kBoth);
CLI::Option* add_seed_option(CLI::App* app, const std::string& name, uint64_t& value,
                             const std::string& help);

}  // namespace moecore::cli
