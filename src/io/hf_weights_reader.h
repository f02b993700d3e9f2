// Reading the weights of a Hugging Face model directory (model.safetensors, or
// model.safetensors.index.json and its shards) into fp32 parameters.
//
// Strict, because broken conversions (silently dropped experts, wrong layouts) fail silently:
// every parameter of the configuration must be present with its exact shape, every tensor in the
// files must be a parameter (an expert beyond num_experts, a shard tensor the index leaves out:
// "unused"), and only F32 and BF16 are read (BF16 widens to fp32 exactly). Each error names the
// tensor and its file.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "model/params.h"

namespace moecore::io {

struct HfWeightsRead {
  int64_t tensors = 0;
  int64_t files = 0;
  std::set<std::string> dtypes;  // "F32", "BF16"
};

// Loads <dir>'s weights into params (sized by layout) as fp32.
HfWeightsRead read_hf_weights(const ParamLayout& layout, const std::string& dir,
                              ParamBuffers& params);
// The same checks without reading the data (the headers only): a trainer checks its inputs before
// it writes anything.
HfWeightsRead check_hf_weights(const ParamLayout& layout, const std::string& dir);

}  // namespace moecore::io
