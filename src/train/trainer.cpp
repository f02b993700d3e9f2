#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/check.h"
#include "data/byte_corpus.h"
#include "io/file_util.h"
#include "io/model_weights.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"

namespace moecore {

namespace {

double evaluate(Transformer& model, const ParamBuffers& params, const data::ByteCorpus& corpus,
                int64_t batches) {
  std::vector<int32_t> tokens, targets;
  double total = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    corpus.val_window(i, batches, tokens, targets);
    total +=
        model.forward(params, tokens.data(), targets.data(), 1, static_cast<int64_t>(tokens.size()))
            .ce;
  }
  return total / static_cast<double>(std::max<int64_t>(1, batches));
}

}  // namespace

TrainSummary train(const RunConfig& config) {
  const TrainConfig& tc = config.train;
  MOE_CHECK(config.model.vocab_size >= 256,
            "[train] the byte-level corpus needs model.vocab_size >= 256, got {}",
            config.model.vocab_size);
  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));
  // Everything that can be wrong with the inputs is checked before anything is written.
  const data::ByteCorpus corpus =
      data::ByteCorpus::load(config.data.corpus, config.data.val_fraction, tc.seq_len);
  std::filesystem::create_directories(tc.out_dir);
  {
    const std::string text = run_config_to_toml(config);
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                           text.size());
    const std::span<const std::byte> chunks[] = {bytes};
    io::write_file_atomic(tc.out_dir + "/config.toml", chunks, "[train]");
  }
  const ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout), grads(layout);
  init_params(layout, tc.seed, params);
  Transformer model(config.model, layout);
  AdamW optimizer(layout, config.optim);
  std::mt19937_64 rng(tc.seed);

  fmt::print(
      "moecore train: {} parameters ({} dense, {} expert), {} threads, corpus {} ({} train "
      "/ {} val bytes)\n",
      layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert),
      layout.numel(ParamGroup::kDense), layout.numel(ParamGroup::kExpert), omp_get_max_threads(),
      config.data.corpus, corpus.train_bytes(), corpus.val_bytes());
  std::fflush(stdout);

  TrainSummary summary;
  std::vector<int32_t> tokens, targets;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double window_loss = 0.0;
  int64_t window_steps = 0;
  for (int64_t step = 0; step < tc.max_steps; ++step) {
    corpus.sample_train(rng, tc.batch_size, tokens, targets);
    grads.zero();
    const LossParts loss =
        model.forward(params, tokens.data(), targets.data(), tc.batch_size, tc.seq_len);
    model.backward(params, grads, 1.0f);
    const double norm = clip_grad_norm(grads, config.optim.max_grad_norm);
    const double lr = learning_rate(config.optim, step, tc.max_steps);
    optimizer.step(params, grads, lr);

    if (step == 0) summary.first_loss = loss.ce;
    summary.last_loss = loss.ce;
    summary.steps = step + 1;
    window_loss += loss.ce;
    ++window_steps;
    const bool last =
        step + 1 == tc.max_steps || (tc.max_seconds > 0 && elapsed() > tc.max_seconds);
    if ((step + 1) % tc.log_every == 0 || last) {
      const double seconds = elapsed();
      const double tokens_per_s =
          static_cast<double>((step + 1) * tc.batch_size * tc.seq_len) / seconds;
      fmt::print(
          "step {:>5}/{}  loss {:.4f}  lb {:.4f}  z {:.3f}  grad_norm {:.3f}  lr {:.2e}  "
          "{:.0f} tok/s  {:.0f}s\n",
          step + 1, tc.max_steps, window_loss / static_cast<double>(window_steps), loss.lb, loss.z,
          norm, lr, tokens_per_s, seconds);
      std::fflush(stdout);
      window_loss = 0.0;
      window_steps = 0;
    }
    if (tc.eval_every > 0 && ((step + 1) % tc.eval_every == 0 || last)) {
      summary.val_loss = evaluate(model, params, corpus, tc.eval_batches);
      fmt::print("eval  step {:>5}  val_loss {:.4f}  val_ppl {:.2f}\n", step + 1, summary.val_loss,
                 std::exp(summary.val_loss));
      std::fflush(stdout);
    }
    if (last) break;
  }
  io::save_weights(layout, params, tc.out_dir + "/model.safetensors");
  fmt::print("saved {}/model.safetensors after {} steps ({:.0f}s); train loss {:.4f} -> {:.4f}\n",
             tc.out_dir, summary.steps, elapsed(), summary.first_loss, summary.last_loss);
  return summary;
}

}  // namespace moecore
