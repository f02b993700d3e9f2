#include "io/json_excerpt.h"

#include <fmt/format.h>

#include <algorithm>

namespace moecore {

std::string json_excerpt(const nlohmann::json& value) {
  constexpr size_t kMaxFlatElements = 16;
  if (!value.is_structured()) return value.dump();
  const bool flat = std::none_of(value.begin(), value.end(),
                                 [](const nlohmann::json& v) { return v.is_structured(); });
  if (flat && value.size() <= kMaxFlatElements) return value.dump();
  return fmt::format("an {} of {} {}{}", value.is_array() ? "array" : "object", value.size(),
                     value.is_array() ? "elements" : "keys", flat ? "" : " (nested)");
}

}  // namespace moecore
