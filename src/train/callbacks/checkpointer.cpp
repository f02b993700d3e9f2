#include "train/callbacks/checkpointer.h"

#include <fmt/format.h>
#include <omp.h>

#include <cstdlib>

#include "core/check.h"
#include "core/device_memory.h"
#include "io/file_util.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/train_context.h"

namespace moecore {

namespace {

std::optional<int64_t> write_fault_from_env() {
  const char* value = std::getenv("MOECORE_FAULT_WRITE_BYTES");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::stoll(value);
}

}  // namespace

CheckpointCallback::CheckpointCallback(int64_t owner_pid, nlohmann::json hf_config,
                                       std::string tokenizer_json,
                                       std::map<std::string, std::string> hf_side_files,
                                       std::optional<int64_t> resumed_step)
    : owner_pid_(owner_pid),
      hf_config_(std::move(hf_config)),
      tokenizer_json_(std::move(tokenizer_json)),
      hf_side_files_(std::move(hf_side_files)),
      last_saved_(resumed_step.value_or(-1)),
      write_fault_(write_fault_from_env()) {}

void CheckpointCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  const int64_t every = ctx.config.train.save_every;
  if (every > 0 && report.step % every == 0) save(ctx);
}

void CheckpointCallback::on_end(TrainContext& ctx) {
  if (last_saved_ != ctx.step) save(ctx);
}

void CheckpointCallback::save(TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  const int64_t at_step = ctx.step;
  last_saved_ = at_step;
  nlohmann::json state = {{"step", at_step},
                          {"tokens_seen", ctx.tokens_seen},
                          {"data_cursor", ctx.loader.cursor()},
                          {"seed", tc.seed},
                          {"rng", {{"kind", "counter-based data order"}, {"seed", tc.seed}}},
                          {"step_guard", ctx.guard.to_json()},
                          {"recipe_revision", kRecipeRevision},
                          {"gerrymandering", ctx.gerrymandering.to_json()},
                          {"spike_monitor", ctx.spikes.to_json()}};
  // The next update's rate, for a reader of the checkpoint; none at the run's end (past it a
  // schedule's linear decay would go on below its floor). Under train.batch_sizes the change
  // before the next update is made before this checkpoint (the trainer's loop): the batch and
  // initial_lr in force are the next update's.
  if (at_step < tc.max_steps)
    state["lr_next"] =
        learning_rate(ctx.config.optim, at_step, tc.max_steps, tc.batch_size * tc.seq_len,
                      token_origin(ctx.replay_origin), tc.max_tokens, ctx.initial_lr);
  // The batch sizes in force so far, the last this step's (train/batch_size_schedule.h).
  if (tc.has_batch_size_schedule()) state["batch_size_history"] = ctx.batch_size_history;
  state["train_data"] = {{"tokens", ctx.train_data.tokens},
                         {"instances", ctx.train_data.instances},
                         {"sample_hash", fmt::format("{:016x}", ctx.train_data.sample_hash)}};
  // The host's threads a rank (what a CPU run's sums split by; a device run's checkpoint says the
  // same, so that the two runs' checkpoints are byte-identical, and resuming compares it on the
  // CPU).
  state["threads"] = omp_get_max_threads();
  if (ctx.eval_pending) state["eval_pending"] = true;
  if (ctx.replay_origin != ReplayOrigin{}) {
    state["replay_origin"] = {{"step", ctx.replay_origin.step},
                              {"data_cursor", ctx.replay_origin.data_cursor},
                              {"tokens_seen", ctx.replay_origin.tokens_seen}};
    if (ctx.replay_origin.epoch > 0) {
      state["replay_origin"]["epoch"] = ctx.replay_origin.epoch;
      state["replay_origin"]["epoch_tokens"] = ctx.replay_origin.epoch_tokens;
    }
  }
  // config.toml: the configuration as given (the batch in force is the state's).
  const CheckpointContents contents{
      &ctx.given_config, &ctx.full_layout, nullptr,       nullptr, state,
      hf_config_,        tokenizer_json_,  hf_side_files_};
  // Collective: every rank writes its part (see DistributedOptimizer::checkpoint_state).
  const CheckpointPart part{ctx.world.rank(),
                            ctx.world.size(),
                            &ctx.params,
                            ctx.optimizer.checkpoint_weights(),
                            ctx.optimizer.checkpoint_state(),
                            ctx.optimizer.steps_taken(),
                            {}};
  const std::string dir =
      save_collectively(ctx.world, tc.out_dir, at_step, owner_pid_, part, contents, tc.keep_last);
  if (ctx.world.rank() != 0) return;
  ctx.progress.message(fmt::format("checkpoint {}", dir));
  ctx.report_checkpoint(at_step, dir);
  if (write_fault_) io::set_write_failure_for_testing(*write_fault_);
}

std::string save_collectively(const dist::Communicator& world, const std::string& run_dir,
                              int64_t step, int64_t owner_pid, const CheckpointPart& part,
                              const CheckpointContents& contents, int64_t keep_last) {
  const bool rank0 = world.rank() == 0;
  const std::string staging = checkpoint_staging_dir(run_dir, step, owner_pid);
  if (rank0) begin_checkpoint(run_dir, step, owner_pid);
  world.barrier();
  try {
    write_checkpoint_part(staging, part);
  } catch (...) {
    if (world.size() == 1) discard_checkpoint(staging);
    throw;
  }
  world.barrier();
  return rank0 ? commit_checkpoint(run_dir, step, staging, contents, world.size(), keep_last)
               : std::string();
}

TrainerState restore_checkpoint(const std::string& dir, const TrainConfig& written_by,
                                const ModelConfig& model, const ParamLayout& full,
                                const ParamLayout& local, ParamBuffers& params,
                                dist::DistributedOptimizer& optimizer, StepGuard& guard,
                                GerrymanderingDetector& gerrymandering, SpikeMonitor& spikes,
                                bool reset_moments) {
  // Each rank reads only what it holds: its tensors' weights and its share of the moments.
  const CheckpointReader reader = CheckpointReader::open(dir, model, full, true);
  reader.read_weights(local, params);
  optimizer.restore_state(
      [&reader, reset_moments](const ParamSpec& spec, size_t first, size_t count, float* exp_avg,
                               float* exp_avg_sq) {
        if (reset_moments) {
          zero_bytes(exp_avg, count * sizeof(float));
          zero_bytes(exp_avg_sq, count * sizeof(float));
          return;
        }
        reader.read_moments(spec.name, first, count, exp_avg, exp_avg_sq);
      },
      reader.steps_taken());
  // The trainer state, checked field by field against the config that wrote it.
  const TrainerState resumed = load_trainer_state(dir, written_by);
  MOE_CHECK(reader.steps_taken() <= resumed.step,
            "[checkpoint] {}: the optimizer's steps_taken={} exceeds the trainer state's step={}",
            dir, reader.steps_taken(), resumed.step);
  guard.from_json(resumed.step_guard);
  gerrymandering.from_json(resumed.gerrymandering);
  if (!resumed.spike_monitor.is_null()) spikes.from_json(resumed.spike_monitor);
  return resumed;
}

}  // namespace moecore
