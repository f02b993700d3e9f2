#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "core/check.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/metrics_sink.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/gerrymandering.h"
#include "train/moe_metrics.h"
#include "train/progress.h"
#include "train/sample.h"
#include "train/step_guard.h"

namespace moecore {

namespace {

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  const std::span<const std::byte> chunks[] = {bytes};
  io::write_file_atomic(path, chunks, "[train]");
}

// Test hook for the "disk full during save" proof: MOECORE_FAULT_WRITE_BYTES=N makes file writes
// fail with ENOSPC after N more bytes, once the first checkpoint is on disk.
std::optional<int64_t> write_fault_from_env() {
  const char* value = std::getenv("MOECORE_FAULT_WRITE_BYTES");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::stoll(value);
}

}  // namespace

TrainSummary train(const RunConfig& config, const TrainOptions& options) {
  const TrainConfig& tc = config.train;
  const ModelConfig& mc = config.model;
  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));

  // Every input is opened and checked before anything is written.
  MOE_CHECK(!config.data.train.empty(), "[train] data.train lists no token files");
  const data::TokenDataset train_data =
      data::TokenDataset::open(config.data.train, tc.seq_len, mc.vocab_size);
  std::optional<data::TokenDataset> val_data;
  if (!config.data.val.empty())
    val_data = data::TokenDataset::open(config.data.val, tc.seq_len, mc.vocab_size);
  std::optional<data::Tokenizer> tokenizer;
  if (!config.data.tokenizer.empty()) {
    tokenizer = data::Tokenizer::load(config.data.tokenizer);
    MOE_CHECK(tokenizer->vocab_size() <= mc.vocab_size,
              "[train] tokenizer {} has {} tokens but model.vocab_size={}", config.data.tokenizer,
              tokenizer->vocab_size(), mc.vocab_size);
  }
  const ParamLayout layout = ParamLayout::build(mc);
  std::error_code ec;
  std::filesystem::create_directories(tc.out_dir, ec);
  MOE_CHECK(!ec, "[train] cannot create output directory '{}': {}", tc.out_dir, ec.message());
  remove_interrupted_saves(tc.out_dir);
  const std::vector<std::string> existing = list_checkpoints(tc.out_dir);
  MOE_CHECK(options.resume || existing.empty(),
            "[train] {} already holds checkpoints: pass --resume to continue that run, or choose "
            "another train.out_dir",
            tc.out_dir);
  std::vector<std::string> damaged;
  const std::optional<std::string> checkpoint =
      options.resume ? latest_valid_checkpoint(tc.out_dir, &damaged) : std::nullopt;
  MOE_CHECK(
      existing.empty() || checkpoint.has_value(),
      "[train] none of the {} checkpoints in {} can be resumed (newest: {}); refusing to start "
      "over on top of them",
      existing.size(), tc.out_dir, damaged.empty() ? existing.back() : damaged.front());

  ParamBuffers params(layout), grads(layout);
  init_params(layout, tc.seed, params);
  Transformer model(mc, layout);
  AdamW optimizer(layout, config.optim);
  StepGuard guard({tc.skip_sigma, tc.skip_window, tc.skip_min_window});
  GerrymanderingDetector gerrymandering({tc.gerrymander_window, tc.gerrymander_threshold});
  int64_t step = 0, tokens_seen = 0;
  uint64_t cursor = 0;
  if (checkpoint) {
    const nlohmann::json state = load_checkpoint(*checkpoint, mc, layout, params, &optimizer);
    step = state.at("step").get<int64_t>();
    tokens_seen = state.at("tokens_seen").get<int64_t>();
    cursor = state.at("data_cursor").get<uint64_t>();
    MOE_CHECK(state.at("seed").get<uint64_t>() == tc.seed,
              "[train] {} was trained with train.seed={} but the config says {}", *checkpoint,
              state.at("seed").get<uint64_t>(), tc.seed);
    guard.from_json(state.at("step_guard"));
    gerrymandering.from_json(state.at("gerrymandering"));
  }
  // Written only once the inputs and the checkpoint are known to fit this config.
  write_text_atomic(tc.out_dir + "/config.toml", run_config_to_toml(config));
  data::DataLoader loader(train_data, tc.seed, cursor);
  io::MetricsSink metrics(tc.out_dir, step);
  const nlohmann::json hf_config = io::hf_config_json(
      mc, tc.seq_len, tokenizer ? std::optional<int32_t>(tokenizer->eos_id()) : std::nullopt);
  const std::optional<int64_t> write_fault = write_fault_from_env();
  const std::string tokenizer_json = tokenizer ? tokenizer->to_json() : std::string();

  Progress progress(tc.max_steps, tc.log_every);
  for (const std::string& reason : damaged)
    progress.message(fmt::format("warning: skipped damaged checkpoint {}", reason));
  progress.message(fmt::format(
      "moecore train: {:.2f}M parameters ({:.2f}M dense, {:.2f}M expert), {} threads, {} train "
      "instances of {} tokens{}",
      static_cast<double>(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert)) /
          1e6,
      static_cast<double>(layout.numel(ParamGroup::kDense)) / 1e6,
      static_cast<double>(layout.numel(ParamGroup::kExpert)) / 1e6, omp_get_max_threads(),
      train_data.num_instances(), tc.seq_len,
      checkpoint ? fmt::format(", resumed from {} (step {})", *checkpoint, step) : ""));

  const int64_t rows = tc.batch_size / tc.microbatches;
  const float micro_scale = 1.0f / static_cast<float>(tc.microbatches);
  const int64_t eval_instances = tc.eval_batches * rows;
  auto save = [&](int64_t at_step) {
    const nlohmann::json state = {
        {"step", at_step},
        {"tokens_seen", tokens_seen},
        {"data_cursor", loader.cursor()},
        {"seed", tc.seed},
        {"rng", {{"kind", "counter-based data order"}, {"seed", tc.seed}}},
        {"lr_next", learning_rate(config.optim, at_step, tc.max_steps)},
        {"step_guard", guard.to_json()},
        {"gerrymandering", gerrymandering.to_json()}};
    const std::string dir = save_checkpoint(
        tc.out_dir, at_step,
        {&config, &layout, &params, &optimizer, state, hf_config, tokenizer_json}, tc.keep_last);
    progress.message(fmt::format("checkpoint {}", dir));
    if (write_fault) io::set_write_failure_for_testing(*write_fault);
  };
  auto run_eval = [&](int64_t at_step) -> double {
    if (!val_data) return 0.0;
    const EvalResult r = evaluate(model, params, *val_data, rows, eval_instances);
    metrics.log(at_step, {{"val/loss", r.loss}, {"val/ppl", r.perplexity}});
    progress.message(fmt::format("eval  step {:>6}  val_loss {:.4f}  val_ppl {:.2f}  ({} tokens)",
                                 at_step, r.loss, r.perplexity, r.tokens));
    return r.loss;
  };

  TrainSummary summary;
  summary.start_step = step;
  std::vector<int32_t> tokens, targets;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t last_saved = checkpoint ? step : -1;
  while (step < tc.max_steps) {
    grads.zero();
    LossParts loss;
    for (int64_t micro = 0; micro < tc.microbatches; ++micro) {
      loader.next_batch(rows, tokens, targets);
      const LossParts part = model.forward(params, tokens.data(), targets.data(), rows, tc.seq_len);
      model.backward(params, grads, micro_scale);
      loss.ce += part.ce * static_cast<double>(micro_scale);
      loss.lb += part.lb * static_cast<double>(micro_scale);
      loss.z += part.z * static_cast<double>(micro_scale);
      loss.total += part.total * static_cast<double>(micro_scale);
    }
    const double lr = learning_rate(config.optim, step, tc.max_steps);
    const double norm = global_grad_norm(grads);
    const std::string skip_reason = guard.check(loss.total, norm);
    if (skip_reason.empty()) {
      clip_grad_norm(grads, config.optim.max_grad_norm);
      optimizer.step(params, grads, lr);
    } else {
      progress.message(
          fmt::format("warning: step {} skipped ({}); weights unchanged", step + 1, skip_reason));
    }
    ++step;
    tokens_seen += tc.batch_size * tc.seq_len;

    // Diagnostics of the last micro-batch.
    const MoeMetrics moe = compute_moe_metrics(model);
    const GerrymanderingDetector::Verdict verdict =
        gerrymandering.observe(loss.lb, moe.mean_load_imbalance);
    if (verdict.newly_flagged)
      progress.message(fmt::format(
          "warning: token gerrymandering at step {}: load-balancing loss trend {:+.1f}% while load "
          "imbalance trend {:+.1f}% over the last {} steps",
          step, 100.0 * verdict.lb_trend, 100.0 * verdict.imbalance_trend, tc.gerrymander_window));

    const double seconds = elapsed();
    const double tokens_per_s =
        static_cast<double>((step - summary.start_step) * tc.batch_size * tc.seq_len) / seconds;
    io::MetricsSink::Scalars scalars = {
        {"train/loss", loss.total},
        {"train/ce", loss.ce},
        {"train/lb", loss.lb},
        {"train/z", loss.z},
        {"train/grad_norm", norm},
        {"train/lr", lr},
        {"train/tokens_per_s", tokens_per_s},
        {"train/tokens_seen", static_cast<double>(tokens_seen)},
        {"train/skipped_steps", static_cast<double>(guard.skipped())},
        {"moe/gerrymandering", verdict.flagged ? 1.0 : 0.0},
        {"moe/lb_trend", verdict.lb_trend},
        {"moe/imbalance_trend", verdict.imbalance_trend}};
    const bool log_step = step % tc.log_every == 0 || step == tc.max_steps;
    for (auto& scalar : moe.scalars(log_step)) scalars.push_back(std::move(scalar));
    metrics.log(step, scalars);
    if (step == summary.start_step + 1) summary.first_loss = loss.ce;
    summary.last_loss = loss.ce;
    progress.update(step, loss.ce, tokens_per_s,
                    seconds / static_cast<double>(step - summary.start_step),
                    fmt::format("lb {:.3f}  imb {:.2f}  gnorm {:.2f}  lr {:.1e}", loss.lb,
                                moe.mean_load_imbalance, norm, lr));

    const bool out_of_time = tc.max_seconds > 0.0 && seconds >= tc.max_seconds;
    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step < tc.max_steps && !out_of_time)
      run_eval(step);
    if (tc.save_every > 0 && step % tc.save_every == 0) {
      save(step);
      last_saved = step;
    }
    if (out_of_time) {
      progress.message(
          fmt::format("train.max_seconds={} reached at step {}: stopping (resume "
                      "with --resume)",
                      tc.max_seconds, step));
      break;
    }
  }
  if (last_saved != step) save(step);
  summary.steps = step;
  summary.skipped_steps = guard.skipped();
  summary.val_loss = run_eval(step);
  metrics.close();
  if (tokenizer && tc.sample_tokens > 0) {
    // The run is complete and saved; a model that cannot be sampled (e.g. non-finite weights after
    // a diverged run) only loses its sample.
    try {
      const std::string sample = generate_sample(mc, layout, params, *tokenizer, tc.sample_prompt,
                                                 tc.sample_tokens, tc.seed);
      progress.message(fmt::format("sample: {}{}", tc.sample_prompt, sample));
    } catch (const Error& e) {
      progress.message(fmt::format("warning: no sample: {}", e.what()));
    }
  }
  progress.message(fmt::format(
      "done: {} steps ({} skipped) in {:.0f}s; train loss {:.4f} -> {:.4f}; "
      "val loss {:.4f}",
      step, guard.skipped(), elapsed(), summary.first_loss, summary.last_loss, summary.val_loss));
  return summary;
}

}  // namespace moecore
