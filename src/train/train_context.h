// What the training loop and its callbacks share: the run's configuration, process groups, model,
// optimizer, data cursor and the state of the run (step, tokens, stop requests, summary). train()
// builds it; callbacks read it and change only what their concern owns.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "dist/distributed_optimizer.h"
#include "dist/mesh.h"
#include "model/transformer.h"
#include "train/callback.h"
#include "train/gerrymandering.h"
#include "train/pipeline_runner.h"
#include "train/progress.h"
#include "train/run_config.h"
#include "train/spike_monitor.h"
#include "train/step_graph.h"
#include "train/step_guard.h"
#include "train/trainer.h"
#include "train/trainer_state.h"

namespace moecore {

struct TrainContext {
  // The run's configuration with the batch in force (train.batch_sizes moves train.batch_size,
  // microbatches and max_steps during the run: train/batch_size_schedule.h), and as it was given,
  // which config.toml and the checkpoints record.
  const RunConfig& config;
  const RunConfig& given_config;
  const dist::Communicator& world;
  const dist::Mesh& mesh;
  Progress& progress;
  const ParamLayout& full_layout;  // the whole model (checkpoints, the sample)
  const ParamLayout& layout;       // what this rank holds
  ParamBuffers& params;
  std::vector<Transformer*> chunks;  // this rank's pipeline chunks
  PipelineRunner& pipeline;
  dist::DistributedOptimizer& optimizer;
  data::DataLoader& loader;
  StepGuard& guard;
  GerrymanderingDetector& gerrymandering;
  SpikeMonitor& spikes;
  Transformer::BatchSum dp_batch_sum;     // the chunks' batch statistics over the dp group
  bool rowwise_dispatch = false;          // experts exchanged by the rowwise dispatch (drop rates)
  int64_t rows = 0;                       // sequences per micro-batch, all data-parallel ranks
  data::DatasetFingerprint train_data{};  // what the checkpoints record of the training set

  // The step's decision where the gradients are (kernels::step_decision): [loss, norm, applied],
  // the factors the update reads, and with pipeline stages the step's loss as one row.
  DeviceArray<double> decision{};
  DeviceArray<float> step_factors{};
  DeviceArray<double> stage_loss_row{};
  // The step guard's limits for the step, [loss, norm], staged where the decision reads them.
  DeviceArray<double> step_limits{};
  // train.cuda_graph: the steps' graph and the static buffers of their inputs; else null.
  std::unique_ptr<StepGraph> step_graph{};

  int64_t step = 0;  // optimizer steps done
  int64_t tokens_seen = 0;
  int64_t start_tokens = 0;  // tokens_seen when this process began training
  ReplayOrigin replay_origin{};
  // The batch sizes in force so far (train.batch_sizes; {train.batch_size} without a schedule) and
  // the learning-rate schedule's initial_lr they give (optim.lr x sqrt of each change's factor).
  std::vector<int64_t> batch_size_history{};
  double initial_lr = 0.0;
  // The sequence length the last update trained at (train.seq_len_warmup_steps; 0: none yet).
  int64_t warmup_seq_len = 0;
  // The step the loop ends at: train.max_steps, or a hard stop's step before it
  // (run_config.h's last_step).
  int64_t last_step = 0;
  TrainSummary summary{};
  // Set on the step that ends the run early (every rank agrees): the signal, or max_seconds, and
  // the line that says so.
  int stop_signal = 0;
  bool out_of_time = false;
  std::string stop_message{};
  // Set on the step that reached train.skip_max_consecutive: the run stops (saved) and fails.
  std::string gave_up{};
  // A stop signal cancelled the evaluation due at `step` (the checkpoint records it; a resumed run
  // makes it up first).
  bool eval_pending = false;
  // Evaluates the weights the chunks hold now as merged ones (the validation loss and the
  // downstream tasks, logged as val/merged/... and eval/merged/downstream/...), collective; set by
  // the trainer when the run evaluates (an evaluator callback), else empty. The model merger calls
  // it with a window's average in place, as OLMo-core's ModelMergeCallback runs its evaluators.
  std::function<void(int64_t step)> evaluate_merged{};
  bool stopping() const { return stop_signal != 0 || out_of_time || !gave_up.empty(); }
  // "peak RSS ... MiB per rank (max over N ranks)[; per stage [...] MiB]" for the last line.
  std::string peak_memory{};

  std::chrono::steady_clock::time_point loop_start = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
  }

  // The callbacks, in registration order (the run's own, then the caller's: TrainOptions);
  // results one callback produces reach all of them.
  std::vector<std::shared_ptr<Callback>> callbacks{};
  void report_eval(int64_t at_step, const EvalResult& result) {
    for (auto& callback : callbacks) callback->on_eval(*this, at_step, result);
  }
  void report_checkpoint(int64_t at_step, const std::string& dir) {
    for (auto& callback : callbacks) callback->on_checkpoint(*this, at_step, dir);
  }
};

}  // namespace moecore
