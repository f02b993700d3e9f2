// An untrusted JSON value as an error message shows it. nlohmann's dump() recurses once per level
// of nesting, so dumping a value read from a file (a trainer_state.json field, a safetensors shape
// entry) can overflow the stack on input like [[[[...]]]]; this never recurses and stays short.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moecore {

// Scalars and flat containers of at most 16 scalars as JSON text (e.g. `-5`, `"x"`, `[3, 4]`),
// anything else described by its kind and size (`an array of 3 elements (nested)`).
std::string json_excerpt(const nlohmann::json& value);

}  // namespace moecore
