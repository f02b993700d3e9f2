// A run's whole configuration: [model], [optim], [train], [data] tables of a TOML file, plus
// `--set section.key=value` overrides. Unknown tables or keys and wrong value types are errors, so
// a typo never silently falls back to a default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "data/icl_task.h"
#include "data/instance_filter.h"
#include "data/lm_eval_set.h"
#include "data/order_rule.h"
#include "dist/pipeline_schedule.h"
#include "model/activation_recompute.h"
#include "model/config.h"
#include "model/init_rule.h"
#include "model/precision_recipe.h"
#include "optim/lr_schedule.h"
#include "optim/optim_config.h"
#include "train/step_guard.h"

namespace moecore {

// The most threads a config or `bench gemm --threads` may ask for. libgomp overflows its stack
// somewhere past a few thousand threads (65536 crashed with no message); beyond the machine's
// cores more threads only slow a run down, and the trainer also refuses more than 4 per core.
inline constexpr int64_t kMaxThreads = 1024;

// train.cuda_grouped_gemm's values.
enum class CudaGroupedGemm { kPerExpert, kOneLaunch };
inline const char* cuda_grouped_gemm_name(CudaGroupedGemm g) {
  return g == CudaGroupedGemm::kOneLaunch ? "one_launch" : "per_expert";
}

// train.batch_size_units: what train.batch_size_starts count (OLMo-core's Duration units).
enum class BatchSizeUnits { kSteps, kTokens, kEpochs };
inline const char* batch_size_units_name(BatchSizeUnits u) {
  return u == BatchSizeUnits::kTokens   ? "tokens"
         : u == BatchSizeUnits::kEpochs ? "epochs"
                                        : "steps";
}

struct TrainConfig {
  uint64_t seed = 0;  // data order, routing draws, and the initialisation unless init_seed is set
  // The weights' initialisation alone (OLMo-core's model init_seed, apart from its data loader's
  // seed): -1 (the default) takes seed. A new data order over the same initial weights is a new
  // seed with the old init_seed.
  int64_t init_seed = -1;
  uint64_t weights_seed() const { return init_seed >= 0 ? static_cast<uint64_t>(init_seed) : seed; }
  // The initial weights' distributions (model/init_rule.h): init_method "moecore" (default),
  // or OLMo-core's "normal" | "llama" | "llama_depth" | "fan_in"; init_std, embedding_init_std.
  InitOptions init;
  int64_t max_steps = 1000;
  // The run's length in tokens instead (OLMo-core's max_duration = Duration.tokens(n); 0: none,
  // max_steps gives it). Exclusive with max_steps, which it then sets: the run stops at the first
  // update whose tokens seen reach it (max_steps_for_tokens), and a schedule in tokens runs over
  // exactly max_tokens, as OLMo-core's trainer asks its scheduler.
  int64_t max_tokens = 0;
  // Or in epochs of the training set (OLMo-core's Duration.epochs(n); 0: none): the updates until
  // the data cursor reaches max_epochs x an epoch's instances (under data.order = "olmo-core"
  // whole global batches, as its loader's total_batches; under moecore's order every instance,
  // the last batch running into the next epoch). max_steps is then 0 until the training set is
  // read (max_steps_for_epochs, train/training_data.h), where the trainer sets it.
  int64_t max_epochs = 0;
  // OLMo-core's Trainer.hard_stop (0: none; one of the two): the run stops once this many updates
  // are done, or once the tokens seen reach hard_stop_tokens, while its schedule still runs over
  // the whole length above (an ablation that trains the first part of a long run's schedule);
  // it ends as at its length (final evaluation, checkpoint, sample), and a resume without it
  // goes on towards the length.
  int64_t hard_stop_steps = 0;
  int64_t hard_stop_tokens = 0;
  // Or once the data cursor reaches this many epochs of the training set (OLMo-core's
  // Duration.epochs: its trainer's epoch past it), counted as train.max_epochs counts a length
  // (training_data.h's last_step_with_data: the training set is needed).
  int64_t hard_stop_epochs = 0;
  // OLMo-core's ModelMergeCallback: at each merge step (merge_steps, or every merge_interval
  // updates up to the run's length; neither: none) a weights-only checkpoint of the weights
  // averaged over the updates (merge_step - merge_last_n_steps, merge_step] is written under
  // out_dir/merged (train/callbacks/model_merger.h).
  std::vector<int64_t> merge_steps;
  int64_t merge_interval = 0;
  int64_t merge_last_n_steps = 500;
  int64_t batch_size = 8;    // sequences per optimizer step
  int64_t microbatches = 1;  // gradient accumulation: batch_size / microbatches sequences at once
  // OLMo-core's BatchSizeSchedulerCallback (empty: train.batch_size throughout): the global batch
  // is batch_sizes[i] sequences once batch_size_starts[i] (in batch_size_units) is reached, the
  // first entry train.batch_size from 0. The micro-batch keeps batch_size / microbatches
  // sequences (more or fewer micro-batches, as OLMo-core keeps its rank_microbatch_size); an
  // increase waits, as OLMo-core's, until the batches its loader read of the epoch are a multiple
  // of the factor (under data.order = "olmo-core"; moecore's order reads on at any batch size);
  // each change multiplies the schedule's initial_lr by sqrt(new / old) and recounts a length in
  // tokens or epochs (train/batch_size_schedule.h).
  std::vector<int64_t> batch_sizes;
  std::vector<int64_t> batch_size_starts;
  BatchSizeUnits batch_size_units = BatchSizeUnits::kSteps;
  bool has_batch_size_schedule() const { return !batch_sizes.empty(); }
  int64_t seq_len = 128;
  // OLMo-core's SequenceLengthSchedulerCallback (train/seq_len_warmup.h; 0: none): over the
  // first seq_len_warmup_steps updates each instance is cut into rows of a shorter length, from
  // seq_len_warmup_min up to seq_len: melted into power-of-2 pieces (the default), or truncated
  // to a multiple of seq_len_warmup_multiple (seq_len_warmup_truncate).
  int64_t seq_len_warmup_steps = 0;
  int64_t seq_len_warmup_min = 128;
  bool seq_len_warmup_truncate = false;
  int64_t seq_len_warmup_multiple = 128;
  int64_t threads = 0;  // 0: every core
  // "cpu" | "cuda": where the model's tensors live and its operations run (cuda: the program's
  // CUDA backend, selected by the moecore command before the run; kernels/cuda/device_selection.h).
  Device device = Device::kCpu;
  // "fp32" | "bf16" | "mxfp8": the GEMMs' operand precision (bf16: fp32 accumulation; master
  // weights, router GEMM, softmax, norm statistics and losses stay fp32; mxfp8: bf16 with the
  // routed experts' GEMMs in MXFP8 as OLMo-core 3 does it, model/precision_recipe.h).
  TrainPrecision precision = TrainPrecision::kFp32;
  // The mxfp8 variants: mxfp8_expert_wgrad, mxfp8_dense (bools), mxfp8_scale ("rceil" | "floor").
  Mxfp8Options mxfp8;
  // "none" | "full" | "moe" | "attention": activations the forward drops and the backward
  // rebuilds, per block (model/activation_recompute.h); losses and gradients are unchanged.
  ActivationRecompute recompute = ActivationRecompute::kNone;
  // Tokens per chunk of the LM head and its cross-entropy (model/chunked_lm_head.h): > 0 keeps no
  // [tokens, vocab] logits from the forward to the backward and computes them again there, one
  // chunk at a time (one more head GEMM per micro-batch); 0: the whole micro-batch at once.
  int64_t lm_head_chunk_tokens = 0;
  // The LM head's z-loss weight, OLMo-core's train-module z_loss_multiplier (its recipes use
  // 1e-5): the step's loss adds z_loss_multiplier * mean over counted targets of
  // logsumexp(logits)^2, trained; 0 (the default): reported as train/lm_z, not trained.
  double z_loss_multiplier = 0.0;
  int64_t log_every = 10;
  int64_t eval_every = 100;  // 0: only at the end
  int64_t eval_batches = 8;
  // OLMo-core's DownstreamEvaluatorCallback: in-context tasks ([[train.downstream_tasks]]: path,
  // label, metric, fast_mc; data/icl_task.h) scored with each validation (train.eval_every and at
  // the end), their metrics logged as eval/downstream/<label> (<what>). Needs data.tokenizer.
  std::vector<data::IclTaskSpec> downstream_tasks;
  // Score them only at the evaluations of steps that are a multiple of this (a multiple of
  // eval_every) and at the end, as OLMo-core's downstream callback has an eval_interval of its
  // own; 0: at every evaluation.
  int64_t downstream_eval_every = 0;
  // OLMo-core's LMEvaluatorCallback over data.lm_eval (train/lm_evaluator.h): its own
  // eval_interval (a multiple of eval_every, and the end; 0: at every evaluation) and
  // eval_duration in batches (0: one epoch, every document its loader visits).
  int64_t lm_eval_every = 0;
  int64_t lm_eval_batches = 0;
  int64_t save_every = 0;  // 0: only at the end
  // false: no checkpoint at all, not even at the end, and so no sample (which decodes the final
  // checkpoint): for benchmarks of large models, whose saves would dominate the run.
  bool checkpoint = true;
  int64_t keep_last = 3;     // checkpoints kept (0: all)
  double max_seconds = 0.0;  // 0: no wall-clock limit; else stop (and save) after this long
  double skip_sigma = 6.0;   // spike threshold of the step guard (<= 0: only NaN/Inf skip)
  int64_t skip_window = 128;
  int64_t skip_min_window = 20;
  // "moecore" | "olmo-core": the guard's window rule (train/step_guard.h); "olmo-core" judges the
  // cross-entropy as OLMo-core's SkipStepOptimizer does (skip_min_window unused).
  SkipRule skip_rule = SkipRule::kMoecore;
  // The run stops (saved, exit status 1) once this many steps in a row were skipped: the weights
  // no longer move, and a guard that skips every step would otherwise burn the rest of the run.
  int64_t skip_max_consecutive = 20;  // 0: no limit
  int64_t gerrymander_window = 100;   // 0: detector off
  double gerrymander_threshold = 0.05;
  // OLMo-core's StabilityMonitorCallback (train/spike_monitor.h): train/spike_score and
  // train/spike_score_total from the cross-entropy's and the gradient norm's spikes.
  bool stability_monitor = false;
  int64_t spike_window = 128;
  int64_t spike_rolling_window = 10000;
  double spike_threshold_std = 6.0;
  std::string sample_prompt = "";  // generated from at the end when data.tokenizer is set
  int64_t sample_tokens = 48;
  bool profile = false;  // time the phases of each step (out_dir/profile.json, `profile:` line)
  // Issue each training step as one device graph (core/device_graph.h: a CUDA graph), captured
  // once and replayed while nothing else ran on the model (train/step_graph.h).
  bool cuda_graph = false;
  // How the CUDA backend runs the routed experts' bf16 GEMMs (mxfp8's dequantised to bf16) when
  // no graph captures them: one cuBLASLt GEMM per expert, the row offsets read back to the host
  // (per_expert), or one launch each of the kernels that read the offsets on the device, as a
  // captured step does (one_launch: no host wait; kernels/cuda/grouped_gemm_device.h).
  CudaGroupedGemm cuda_grouped_gemm = CudaGroupedGemm::kPerExpert;
  std::string out_dir = "runs/default";
};

struct DataConfig {
  std::vector<std::string> train;  // .npy token files or directories of them (OLMo-core format)
  std::vector<std::string> val;
  // OLMo-core's label_mask_paths: one label mask per training (validation) token file, in the
  // same order (data/token_dataset.h); a token whose mask is 0 is no label. Empty: none.
  std::vector<std::string> label_mask;
  std::vector<std::string> val_label_mask;
  // OLMo-core's LM evaluator ([[data.lm_eval]]: label, paths, label_mask; train/lm_evaluator.h):
  // every document of these sets its own padded instance, scored at each evaluation, per label
  // eval/lm/<label>/CE loss and PPL (a label may name several sets). Documents end at
  // data.eos_id (or the files' meta.json).
  std::vector<data::LmEvalSet> lm_eval;
  std::string tokenizer;  // tokenizer.json, for the sample printed at the end (optional)
  // Element type of headerless token files ("uint16", "uint32", "int32", "int64"); empty: from
  // the meta.json `moecore prepare` writes beside them, an error where there is none. Files with
  // a NumPy header say their own type.
  std::string dtype;
  // Intra-document attention masking (OLMo-core's generate_doc_lengths): a token attends only to
  // the tokens of its own document, documents ending at each EOS. Off: plain causal attention.
  bool document_masking = false;
  // The EOS id that ends documents; -1: the token files' meta.json eos_id.
  int64_t eos_id = -1;
  // OLMo-core's bos_token_id: with document masking, a document ends only at an EOS followed by
  // this BOS (model/document_mask.h); -1: none, every EOS ends one.
  int64_t bos_id = -1;
  // The order training instances are read in (data/order_rule.h): "moecore", or "olmo-core" for
  // exactly the batches OLMo-core's NumpyFSLDataLoader reads with train.seed as its seed.
  data::OrderRule order = data::OrderRule::kMoecore;
  // OLMo-core's max_target_sequence_length (0: none): the training files are cut into blocks of
  // this many tokens, each into consecutive instances of train.seq_len (a multiple of which it
  // must be), which OLMo-core's order shuffles as whole chunks; runs with any seq_len up to it
  // read the same tokens (a sequence-length warm-up resumed with a longer seq_len).
  int64_t max_target_seq_len = 0;
  // OLMo-core's instance filter (instance_filter_config; data/instance_filter.h): a training
  // instance that repeats a period of repetition_min_period .. repetition_max_period tokens
  // repetition_max_count times or more is masked (its labels ignored; the loss still counts them
  // as OLMo-core's OLMoDDP train module does). Validation instances are not filtered.
  bool instance_filter = false;
  data::RepetitionFilter repetition;
};

enum class Dispatch { kSync, kRowwise };
// How the rowwise dispatch moves rows: auto (windows for a model in host memory; on a device the
// capacity form's all-to-all-v, which reads the routing's counts on the host), window (one-sided
// puts into MPI windows: host memory only), padded (an all-to-all of static blocks planned on
// the model's device: no host read; model/padded_dispatch.h) or symmetric (padded's blocks, each
// stored by a kernel straight into its destination GPU's symmetric buffer: NCCL's device API,
// dist::DeviceBlockExchange).
enum class RowwiseTransport { kAuto, kWindow, kPadded, kSymmetric };
// Whether the transport moves padded's static blocks (planned where the model is).
inline bool moves_padded_blocks(RowwiseTransport transport) {
  return transport == RowwiseTransport::kPadded || transport == RowwiseTransport::kSymmetric;
}
inline const char* rowwise_transport_name(RowwiseTransport transport) {
  switch (transport) {
    case RowwiseTransport::kWindow:
      return "window";
    case RowwiseTransport::kPadded:
      return "padded";
    case RowwiseTransport::kSymmetric:
      return "symmetric";
    case RowwiseTransport::kAuto:
      break;
  }
  return "auto";
}
enum class CommunicatorKind { kAuto, kMpi, kNccl };

// [parallel]: the process layout. dp (data parallel) is derived: world size / pp; the MoE mesh
// (ep, ep_dp) folds inside each pipeline stage's dp ranks.
struct ParallelConfig {
  int64_t pp = 1;  // pipeline stages (contiguous layers each)
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int64_t virtual_stages = 0;  // model chunks per rank; 0: 2 for interleaved-1f1b, else 1
  // Layers per model chunk, in order (pp * virtual_stages entries summing to num_hidden_layers);
  // empty: balanced automatically.
  std::vector<int64_t> stage_layers;
  int64_t ep = 1;    // expert parallel degree (experts sharded over ep ranks)
  int64_t zero = 0;  // 1: optimizer state sharded over dp (dense) and ep_dp (experts)
  Dispatch dispatch = Dispatch::kSync;
  double capacity_factor = 1.25;  // rowwise dispatch: receive capacity per rank
  RowwiseTransport rowwise_transport = RowwiseTransport::kAuto;
  bool overlap_grad_reduce = false;  // start gradient all-reduces during the backward
  // "auto" | "mpi" | "nccl": the transport of the job's groups (train/communicator_choice.h).
  // auto: NCCL where the model is on a CUDA device, the program has NCCL's communicator and the
  // job more than one rank, each on a GPU of its own, and one pipeline stage; else MPI.
  CommunicatorKind communicator = CommunicatorKind::kAuto;
};

struct RunConfig {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
};

// The step at which the tokens seen reach `tokens` in updates of `per_step` tokens from `origin`
// (the step and tokens seen where the current batch took over): origin.step + ceil((tokens -
// origin.tokens) / per_step), origin.step if they already have.
int64_t step_reaching_tokens(int64_t tokens, int64_t per_step, TokenOrigin origin);

// The step a run of `t` ends at: t.max_steps, or its hard stop's step if that comes first (from
// `origin`, for train.hard_stop_tokens; train.hard_stop_epochs needs the training set:
// training_data.h's last_step_with_data, which the trainer calls).
int64_t last_step(const TrainConfig& t, TokenOrigin origin);

// The model merges of a run of max_steps updates (train/callbacks/model_merger.h): the multiples
// of train.merge_interval up to max_steps, or train.merge_steps.
std::vector<int64_t> merge_steps(const TrainConfig& t, int64_t max_steps);

// OLMo-core's Trainer.max_steps under a max_duration in tokens: the updates from `origin` (the
// step and tokens seen where the current batch size and seq_len took over) until the tokens seen
// reach t.max_tokens, origin.step + ceil((max_tokens - origin.tokens) / tokens a step), none
// after max_tokens; t.max_steps where max_tokens is 0.
int64_t max_steps_for_tokens(const TrainConfig& t, TokenOrigin origin = {});

// The run length the schedule's checks (validate_lr_schedule) take at load: a fresh run's
// max_steps updates of this batch, or none for a resumed run, whose length in tokens depends on
// its checkpoint (the tokens seen there): the trainer checks that one once it has read it. A
// checkpoint's own config.toml is read as kResumed too (its run checked it when it started).
// Under train.max_epochs the length is known once the training set is read: neither checks it
// at load (the trainer and lr-schedule do then).
enum class ScheduleLength { kFresh, kResumed };

// Parses a TOML file (or the text of one) and applies overrides such as "train.max_steps=50".
// [model] keys the file does not set keep their value in `model_base` (the defaults, or a
// config.json's model for `train --init-from`).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {},
                          const ModelConfig& model_base = {},
                          ScheduleLength length = ScheduleLength::kFresh);
RunConfig parse_run_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {},
                           const ModelConfig& model_base = {},
                           ScheduleLength length = ScheduleLength::kFresh);

// The schedule's checks that need the run's length (max_steps updates of tokens_per_step tokens):
// what OLMo-core divides by zero on, asserts against or runs at its floor throughout is a
// one-line error. load_run_config applies them for a fresh run (ScheduleLength::kFresh); a
// caller with another length (debug-state --steps) applies them for its own, and a resume with
// the tokens seen at its `origin` (a schedule in tokens runs over those and the remaining
// updates' once another batch size or seq_len changed the tokens an update adds).
// `max_tokens`: train.max_tokens (0: none), the horizon of a schedule in tokens; `max_epochs`
// (train.max_epochs, 0: none) only names where max_steps came from in errors; `initial_lr` (0:
// optim.lr) the rate the schedule scales (learning_rate's).
void validate_lr_schedule(const OptimConfig& optim, int64_t max_steps, int64_t tokens_per_step,
                          TokenOrigin origin = {}, int64_t max_tokens = 0, int64_t max_epochs = 0,
                          double initial_lr = 0.0);

// The effective configuration as TOML text (saved with every run).
std::string run_config_to_toml(const RunConfig& config);

// "model: hidden_size = 128 vs hidden_size = 256" for the first architecture key of [model] on
// which a and b differ, or "" if none. The loss keys (router_aux_loss_coef, router_z_loss_coef,
// lb_loss_style, lb_loss_scope, lb_loss_granularity, loss_normalizer) are not architecture: see
// train/resume_policy.h.
std::string model_config_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace moecore
