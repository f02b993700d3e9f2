#include "train/sample.h"

#include <algorithm>

#include "core/check.h"
#include "model/inference.h"

namespace moecore {

std::string generate_text(const ModelConfig& config, const ParamLayout& layout,
                          const ParamBuffers& params, const data::Tokenizer& tokenizer,
                          const std::string& prompt, int64_t max_tokens,
                          const SamplingConfig& sampling, const PrecisionRecipe& precision,
                          const std::optional<std::vector<int32_t>>& stop_ids_or_eos) {
  MOE_CHECK(tokenizer.vocab_size() <= config.vocab_size,
            "[generate] the tokenizer has {} tokens but the model's vocab_size is {}: not the "
            "model's tokenizer",
            tokenizer.vocab_size(), config.vocab_size);
  std::vector<int32_t> ids = tokenizer.encode(prompt);
  if (ids.empty()) ids.push_back(tokenizer.eos_id());
  InferenceModel model(config, layout, params,
                       static_cast<int64_t>(ids.size()) + std::max<int64_t>(max_tokens, 1));
  model.set_precision(precision);
  // A padded vocabulary (vocab_size above the tokenizer's) has ids without text: never drawn.
  const std::vector<int32_t> stop_ids = stop_ids_or_eos.value_or(std::vector{tokenizer.eos_id()});
  std::vector<int32_t> out =
      generate(model, ids, max_tokens, sampling, stop_ids, tokenizer.vocab_size());
  if (!out.empty() && std::find(stop_ids.begin(), stop_ids.end(), out.back()) != stop_ids.end())
    out.pop_back();
  return tokenizer.decode_text(out);
}

std::string generate_sample(const ModelConfig& config, const ParamLayout& layout,
                            const ParamBuffers& params, const data::Tokenizer& tokenizer,
                            const std::string& prompt, int64_t max_tokens, uint64_t seed,
                            const PrecisionRecipe& precision) {
  SamplingConfig sampling;
  sampling.temperature = 0.8;
  sampling.top_p = 0.95;
  sampling.seed = seed;
  return generate_text(config, layout, params, tokenizer, prompt, max_tokens, sampling, precision);
}

}  // namespace moecore
