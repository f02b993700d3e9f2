#include "train/callbacks/sampler.h"

#include <fmt/format.h>

#include "core/check.h"
#include "io/model_weights.h"
#include "train/sample.h"
#include "train/train_context.h"

namespace moecore {

void SampleCallback::on_checkpoint(TrainContext&, int64_t, const std::string& dir) {
  last_checkpoint_ = dir;
}

namespace {

// The decoder multiplies the routed experts in bf16 in an mxfp8 run: it has no MX path, and a
// sample is a look at the text, not a measurement.
PrecisionRecipe sample_recipe(const TrainConfig& tc) {
  return PrecisionRecipe::from_train(
      tc.precision == TrainPrecision::kMxfp8 ? TrainPrecision::kBf16 : tc.precision, {});
}

}  // namespace

void SampleCallback::on_end(TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  if (ctx.world.rank() != 0 || tc.sample_tokens <= 0 || ctx.stop_signal != 0) return;
  // A model that cannot be sampled (e.g. non-finite weights after a diverged run) only loses its
  // sample.
  try {
    ParamBuffers whole(ctx.full_layout);
    io::load_weights_from_dir(ctx.full_layout, last_checkpoint_, whole);
    const std::string sample =
        generate_sample(ctx.config.model, ctx.full_layout, whole, tokenizer_, tc.sample_prompt,
                        tc.sample_tokens, tc.seed, sample_recipe(tc));
    ctx.progress.message(fmt::format("sample: {}{}", tc.sample_prompt, sample));
  } catch (const Error& e) {
    ctx.progress.message(fmt::format("warning: no sample: {}", e.what()));
  }
}

}  // namespace moecore
