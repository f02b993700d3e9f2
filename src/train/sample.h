// A text sample from a trained model (printed at the end of a run, and by `moecore generate`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/sampler.h"

namespace moecore {

// Encodes `prompt` (an empty prompt starts a new document: the EOS token), samples up to max_tokens
// with a KV cache and returns the decoded continuation, stopping at any of `stop_ids` (nullopt: the
// tokenizer's EOS; empty: none, max_tokens are generated), which is not decoded.
std::string generate_text(const ModelConfig& config, const ParamLayout& layout,
                          const ParamBuffers& params, const data::Tokenizer& tokenizer,
                          const std::string& prompt, int64_t max_tokens,
                          const SamplingConfig& sampling, const PrecisionRecipe& precision,
                          const std::optional<std::vector<int32_t>>& stop_ids = std::nullopt);

// The end-of-run sample: temperature 0.8, top-p 0.95.
std::string generate_sample(const ModelConfig& config, const ParamLayout& layout,
                            const ParamBuffers& params, const data::Tokenizer& tokenizer,
                            const std::string& prompt, int64_t max_tokens, uint64_t seed,
                            const PrecisionRecipe& precision);

}  // namespace moecore
