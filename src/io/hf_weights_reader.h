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
// A rank's share: the same checks against the whole model's layout (`full`), then only the
// tensors of `share` (a rank's stage and experts, named as in the whole model) read into
// share_params, so that a rank holds no copy of what it does not train.
HfWeightsRead read_hf_weights_share(const ParamLayout& full, const std::string& dir,
                                    const ParamLayout& share, ParamBuffers& share_params);
// The same checks without reading the data (the headers only): a trainer checks its inputs before
// it writes anything.
HfWeightsRead check_hf_weights(const ParamLayout& layout, const std::string& dir);

}  // namespace moecore::io
