#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "core/check.h"
#include "data/dataset_fingerprint.h"
#include "data/icl_task.h"
#include "data/padded_documents.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "dist/alltoall_exchange.h"
#include "dist/distributed_optimizer.h"
#include "dist/expert_layout.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "dist/padded_exchange.h"
#include "dist/pipeline_schedule.h"
#include "dist/rank_reports.h"
#include "dist/rowwise_exchange.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/hf_weights_reader.h"
#include "io/run_dir_lock.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model/router.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "train/batch_size_schedule.h"
#include "train/callbacks/checkpointer.h"
#include "train/callbacks/evaluator.h"
#include "train/callbacks/metrics.h"
#include "train/callbacks/model_merger.h"
#include "train/callbacks/moe_monitor.h"
#include "train/callbacks/peak_memory.h"
#include "train/callbacks/profiler.h"
#include "train/callbacks/rank_stats.h"
#include "train/callbacks/sampler.h"
#include "train/callbacks/stop_signals.h"
#include "train/checkpoint.h"
#include "train/communicator_choice.h"
#include "train/evaluate.h"
#include "train/hf_metadata.h"
#include "train/layout_validation.h"
#include "train/lm_evaluator.h"
#include "train/rank_agreement.h"
#include "train/resume_policy.h"
#include "train/round_trip_check.h"
#include "train/seq_len_warmup.h"
#include "train/train_context.h"
#include "train/training_data.h"

namespace moecore {

namespace {

// Threads per rank: train.threads, or the cores divided among the ranks on this node (ranks that
// each start one thread per core would oversubscribe the machine).
void set_threads(int64_t threads, int world_size) {
  // More than 4 threads per core only slows a run (and a typo like 100000 crashed libgomp).
  const int64_t cores = omp_get_num_procs();
  MOE_CHECK(
      threads <= 4 * cores,
      "[train] train.threads={} is more than 4 x the {} cores of this machine (0: every core)",
      threads, cores);
  if (threads > 0) {
    omp_set_num_threads(static_cast<int>(threads));
  } else if (world_size > 1) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : world_size;
    omp_set_num_threads(std::max(1, omp_get_num_procs() / local_ranks));
  }
}

// The run's inputs, every one opened and checked before anything is written. Resolves the EOS id
// of document masking and of data.lm_eval's documents into `config` (saved with the run, so that
// a checkpoint evaluates alone).
struct RunInputs {
  data::TokenDataset train_data;
  std::optional<data::TokenDataset> val_data;
  int32_t document_eos = -1;
  std::optional<data::Tokenizer> tokenizer;
  // train.downstream_tasks, read and tokenized (data/icl_task.h).
  std::vector<data::IclTask> downstream;
  // data.lm_eval's documents (data/padded_documents.h), and those each evaluation scores
  // (train/lm_evaluator.h).
  std::optional<data::PaddedDocuments> lm_eval;
  std::vector<int64_t> lm_eval_documents;
  // Something to evaluate: validation data, labelled sets or downstream tasks.
  bool evaluates() const { return val_data || lm_eval || !downstream.empty(); }
};

RunInputs open_inputs(RunConfig& config) {
  const TrainConfig& tc = config.train;
  const ModelConfig& mc = config.model;
  MOE_CHECK(!config.data.train.empty(), "[train] data.train lists no token files");
  RunInputs in{open_training_set(config), std::nullopt, -1, std::nullopt, {}, std::nullopt, {}};
  if (!config.data.val.empty())
    in.val_data = data::TokenDataset::open(config.data.val, tc.seq_len, mc.vocab_size,
                                           config.data.dtype, 0, config.data.val_label_mask);
  // Training and validation documents end at the same EOS.
  in.document_eos = document_masking_eos(config.data, in.train_data);
  MOE_CHECK(in.document_eos < 0 || !in.val_data || in.val_data->metadata_eos_id() < 0 ||
                in.val_data->metadata_eos_id() == in.document_eos,
            "[data] data.document_masking: documents end at EOS {} in training but the validation "
            "files' meta.json says eos_id={}",
            in.document_eos, in.val_data ? in.val_data->metadata_eos_id() : -1);
  if (in.document_eos >= 0) config.data.eos_id = in.document_eos;
  // The labelled sets' documents end at data.eos_id, else the EOS their meta.json (or the training
  // files') say; resolved into the config too, so that `moecore eval-lm` of a checkpoint finds
  // the same documents.
  if (!config.data.lm_eval.empty()) {
    in.lm_eval = data::PaddedDocuments::open(
        config.data.lm_eval, tc.seq_len, mc.vocab_size, config.data.dtype,
        config.data.eos_id >= 0 ? config.data.eos_id : in.train_data.metadata_eos_id());
    config.data.eos_id = in.lm_eval->eos_id();
    in.lm_eval_documents = lm_eval_documents(in.lm_eval->num_documents(),
                                             lm_eval_batch_documents(config), tc.lm_eval_batches);
  }
  if (!config.data.tokenizer.empty()) {
    in.tokenizer = data::Tokenizer::load(config.data.tokenizer);
    MOE_CHECK(in.tokenizer->vocab_size() <= mc.vocab_size,
              "[train] tokenizer {} has {} tokens but model.vocab_size={}", config.data.tokenizer,
              in.tokenizer->vocab_size(), mc.vocab_size);
  }
  MOE_CHECK(tc.downstream_tasks.empty() || in.tokenizer,
            "[train] train.downstream_tasks need data.tokenizer: their requests are text");
  for (const data::IclTaskSpec& spec : tc.downstream_tasks)
    in.downstream.push_back(data::load_icl_task(
        spec, *in.tokenizer, static_cast<int32_t>(config.data.bos_id), tc.seq_len));
  return in;
}

// Where the run starts: the newest valid checkpoint under --resume, checked against the resume
// policy (it replays exactly only under the configuration that wrote it), or a fresh start.
struct StartPoint {
  std::optional<std::string> checkpoint;
  std::optional<RunConfig> saved_config;  // the checkpoint's
  std::vector<std::string> messages;      // config changes on resume
  bool config_changed = false;
  // Where the loader starts (train/training_data.h's resume_position) and, under OLMo-core's
  // order, that loader's epoch and tokens read of it there (a replay origin records them).
  ResumePosition position;
  // Newer checkpoints the resume skipped (rank 0's): set aside once the run is known to go ahead.
  std::vector<DamagedCheckpoint> damaged;
  // The run's length in updates: train.max_steps, or under train.max_tokens or max_epochs the
  // updates until the tokens seen or the data cursor reach it, counted from where the current
  // batch took over (OLMo-core's Trainer.max_steps, which another batch size at the resume
  // moves).
  int64_t max_steps = 0;
  // The batch sizes in force so far (train/batch_size_schedule.h): the checkpoint's, unless the
  // resume changes the batch's keys (then the new train.batch_size, as a fresh run's).
  std::vector<int64_t> batch_size_history;
};

// The temporaries of the run directory's files (config.toml, metrics.jsonl, profile.json, the
// rank statistics) that a process killed while it rewrote them left behind (a metrics.jsonl's is
// the whole file). Called under the run's lock.
void remove_interrupted_writes(const std::string& out_dir) {
  io::remove_atomic_write_leftovers(out_dir, [](const std::string& name) {
    return name == "config.toml" || name == "metrics.jsonl" || name == "profile.json";
  });
  const std::string stats = out_dir + "/" + kRankStatsSubdir;  // not created here
  std::error_code ec;
  if (std::filesystem::is_directory(stats, ec))
    io::remove_atomic_write_leftovers(stats, [](const std::string& name) {
      return name.ends_with(".json");  // the directory is moecore's own
    });
}

// Whether a run logged steps in `out_dir` (its metrics.jsonl is not empty).
bool has_logged_steps(const std::string& out_dir) {
  std::error_code ec;
  const std::string metrics = out_dir + "/metrics.jsonl";
  return std::filesystem::is_regular_file(metrics, ec) &&
         std::filesystem::file_size(metrics, ec) > 0 && !ec;
}

// The newest valid checkpoint, the same for every rank: each reads its share of every candidate's
// bytes (every file and tensor is read once, by one rank) and the ranks' verdicts are combined, so
// `damaged` is the same list in every rank.
std::optional<std::string> agreed_checkpoint(const dist::Communicator& world,
                                             const std::string& out_dir, const ModelConfig& mc,
                                             const ParamLayout& full_layout,
                                             std::vector<DamagedCheckpoint>& damaged) {
  VerificationShare share;
  if (world.size() > 1)
    share = {world.rank(), world.size(), [&world](const std::string& reason) {
               return dist::first_report(world, reason).text;
             }};
  return latest_valid_checkpoint(out_dir, mc, full_layout, &damaged, share);
}

StartPoint choose_start(const dist::Communicator& world, const RunConfig& config,
                        const ParamLayout& full_layout, const TrainOptions& options,
                        const data::TokenDataset& train_set,
                        const data::DatasetFingerprint& train_data) {
  const std::string& out_dir = config.train.out_dir;
  const std::vector<std::string> existing = list_checkpoints(out_dir);
  MOE_CHECK(options.resume || existing.empty(),
            "[train] {} already holds checkpoints: pass --resume to continue that run, or choose "
            "another train.out_dir",
            out_dir);
  MOE_CHECK(options.resume || !has_logged_steps(out_dir),
            "[train] {} already holds a run without checkpoints (its metrics.jsonl): choose "
            "another train.out_dir, or pass --resume to start that run again from step 0 "
            "(replacing its logged steps)",
            out_dir);
  StartPoint start;
  start.max_steps = config.train.max_steps;
  start.batch_size_history = {config.train.batch_size};
  std::vector<DamagedCheckpoint> damaged;  // the same in every rank
  if (options.resume)
    start.checkpoint = agreed_checkpoint(world, out_dir, config.model, full_layout, damaged);
  MOE_CHECK(
      existing.empty() || start.checkpoint.has_value(),
      "[train] none of the {} checkpoints in {} can be resumed (newest: {}); refusing to start "
      "over on top of them",
      existing.size(), out_dir,
      damaged.empty() ? existing.back() : damaged.front().dir + ": " + damaged.front().reason);
  MOE_CHECK(options.init_from.empty() || !start.checkpoint,
            "[train] --init-from {} with --resume: {} already holds checkpoint {}; resume it "
            "without --init-from",
            options.init_from, out_dir, start.checkpoint.value_or(""));
  if (!start.checkpoint) {
    // `make train`'s first run; or a mistyped out_dir, which this line makes visible.
    if (options.resume)
      start.messages.push_back(
          fmt::format("note: --resume: {} holds no checkpoint, the run starts at step 0", out_dir));
    return start;
  }
  start.saved_config =
      load_run_config(*start.checkpoint + "/config.toml", {}, {}, ScheduleLength::kResumed);
  std::vector<ConfigChange> changes = replay_config_changes(*start.saved_config, config);
  const TrainerState saved_state = load_trainer_state(*start.checkpoint, start.saved_config->train);
  if (saved_state.train_data) {
    // Another seq_len or max_target_seq_len (a change listed above) cuts the same tokens into
    // other instances.
    const data::DatasetFingerprint& saved = *saved_state.train_data;
    const bool recut =
        start.saved_config->train.seq_len != config.train.seq_len ||
        start.saved_config->data.max_target_seq_len != config.data.max_target_seq_len;
    const bool same = recut ? saved.tokens == train_data.tokens : saved == train_data;
    if (!same)
      changes.push_back(
          {"data.train's contents", data::describe(saved), data::describe(train_data)});
  }
  std::string listed;
  for (const ConfigChange& change : changes)
    listed += (listed.empty() ? "" : "; ") + describe(change);
  MOE_CHECK(changes.empty() || options.allow_config_change,
            "[train] --resume: {} was written with another configuration ({}), so the run would "
            "not replay exactly; pass --allow-config-change to continue with the new values",
            *start.checkpoint, listed);
  // The batch in force: the checkpoint's (train.batch_sizes may have moved it), which the run
  // goes on with unless the resume changes the batch's keys.
  ResumedBatch batch = resumed_batch(*start.saved_config, saved_state, config);
  start.batch_size_history = batch.history;
  const RunConfig &saved_in_force = batch.saved_in_force, &in_force = batch.in_force;
  // Another batch size or seq_len under OLMo-core's order moves the data position as OLMo-core
  // does (train/training_data.h).
  start.position = resume_position(saved_in_force, saved_state, *start.checkpoint, in_force,
                                   train_data.instances);
  const TrainConfig& tc = in_force.train;
  const TokenOrigin origin = schedule_origin(saved_state, !changes.empty());
  start.max_steps = resumed_max_steps(saved_in_force, saved_state, *start.checkpoint, in_force,
                                      !changes.empty(), &train_set, start.position, "[train]");
  // The schedule's checks over the run's real length (the config was read without them): in
  // tokens, the tokens seen so far and the remaining updates' (another batch size or seq_len
  // moves it).
  if (start.max_steps >= saved_state.step)  // else refused below, naming max_steps
    validate_lr_schedule(config.optim, start.max_steps, tc.batch_size * tc.seq_len, origin,
                         tc.max_tokens, tc.max_epochs,
                         scheduled_initial_lr(config.optim.lr, start.batch_size_history));
  for (const ConfigChange& change : changes)
    start.messages.push_back("config change on resume: " + describe(change));
  if (resets_moments(*start.saved_config, config))
    start.messages.push_back(
        fmt::format("optimizer: the Adam moments start from zero at this resume "
                    "(optim.reset_optimizer_moments_on_load); the step count, and with it the bias "
                    "correction, goes on from {}",
                    *start.checkpoint));
  if (const std::string note =
          horizon_note(saved_in_force, in_force, token_origin(saved_state.origin), origin);
      !note.empty())
    start.messages.push_back(note);
  if (start.position.moved)
    start.messages.push_back(describe_resume_position(saved_in_force, in_force, start.position));
  if (saved_state.threads > 0 && config.train.device == Device::kCpu &&
      saved_state.threads != omp_get_max_threads())
    start.messages.push_back(
        fmt::format("note: the run ran on {} OpenMP thread(s) a rank and resumes on {}: the CPU "
                    "kernels split their sums by thread, so it continues close to, not exactly "
                    "on, its path",
                    saved_state.threads, omp_get_max_threads()));
  start.config_changed = !changes.empty();
  start.damaged = std::move(damaged);
  return start;
}

// How the GEMMs multiply, for the start-up line: the recipe of train.precision by name.
std::string gemm_precision_line(const TrainConfig& tc) {
  // The CPU multiplies bf16 natively (AVX512-BF16, AMX) or emulates it in fp32; a GPU's tensor
  // cores take bf16 operands.
  const char* bf16 =
      tc.device != Device::kCpu || kernels::bf16_gemm_path() == kernels::Bf16GemmPath::kNative
          ? "bf16"
          : "bf16 (emulated)";
  switch (tc.precision) {
    case TrainPrecision::kFp32:
      return "fp32";
    case TrainPrecision::kBf16:
      return bf16;
    case TrainPrecision::kMxfp8:
      return fmt::format(
          "mxfp8 (routed and shared experts' forward and input-gradient GEMMs in MXFP8 E4M3, {} "
          "scales, weight gradient in {}; {}the rest {} but the fp32 router)",
          mx::scale_mode_name(tc.mxfp8.scale_mode),
          tc.mxfp8.expert_wgrad ? "MXFP8"
                                : "bf16 (routed: on the saved MXFP8 inputs; shared: on bf16 ones)",
          tc.mxfp8.dense ? "attention projections and dense layers' MLPs all in MXFP8; " : "",
          bf16);
  }
  return "?";
}

// "N update(s) of WHAT" for a fresh run; "N more update(s) of WHAT after step S, to step E" for
// a resumed one (to train.max_steps, the run's length).
// Under train.batch_sizes the count is the batch in force's, which each change recounts.
std::string remaining_updates(const TrainContext& ctx, const std::string& what) {
  const int64_t end = ctx.config.train.max_steps;
  const std::string recounted = ctx.config.train.has_batch_size_schedule()
                                    ? " while this batch size lasts (each change of "
                                      "train.batch_sizes recounts it: `moecore lr-schedule` "
                                      "lists the run)"
                                    : "";
  if (ctx.step == 0) return fmt::format("{} update(s) of {}{}", end, what, recounted);
  return fmt::format("{} more update(s) of {} after step {}, to step {}{}", end - ctx.step, what,
                     ctx.step, end, recounted);
}

// The length of a run in tokens, in updates: OLMo-core's trainer stops at the first update whose
// tokens seen reach train.max_tokens, so the last one may end past it, where a schedule in tokens
// is asked (as OLMo-core asks it) past its end: WSD's and the tails' decays extrapolate below
// their floor there, to a negative rate from a floor of 0, which a warning names.
void announce_max_tokens(const TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  const int64_t per_step = tc.batch_size * tc.seq_len;
  const int64_t last_tokens = ctx.tokens_seen + (tc.max_steps - ctx.step) * per_step;
  ctx.progress.message(
      fmt::format("length: train.max_tokens={}: {} (the last ends at {} tokens)", tc.max_tokens,
                  remaining_updates(ctx, fmt::format("{} x {} tokens", tc.batch_size, tc.seq_len)),
                  last_tokens));
  // Under train.batch_sizes the last update's batch and rate are the schedule's, which
  // `moecore lr-schedule` lists; this batch's last update may not be the run's.
  if (tc.max_steps == ctx.step || tc.has_batch_size_schedule()) return;
  const double last_lr =
      learning_rate(ctx.config.optim, tc.max_steps - 1, tc.max_steps, per_step,
                    token_origin(ctx.replay_origin), tc.max_tokens, ctx.initial_lr);
  if (last_lr < 0.0)
    ctx.progress.message(fmt::format(
        "warning: the last update's learning rate is {}: it ends at {} tokens, past "
        "train.max_tokens={}, where the schedule's linear decay (as OLMo-core's) goes on below "
        "its floor (train.max_tokens={} would end the run on the schedule's end)",
        last_lr, last_tokens, tc.max_tokens, last_tokens));
}

// "train.hard_stop_steps=N", "train.hard_stop_tokens=N" or "train.hard_stop_epochs=N",
// whichever the run has.
std::string hard_stop_text(const TrainConfig& tc) {
  if (tc.hard_stop_epochs > 0) return fmt::format("train.hard_stop_epochs={}", tc.hard_stop_epochs);
  return tc.hard_stop_steps > 0 ? fmt::format("train.hard_stop_steps={}", tc.hard_stop_steps)
                                : fmt::format("train.hard_stop_tokens={}", tc.hard_stop_tokens);
}

// The optimizer's groups under optim.group_overrides, counted over the whole model (as OLMo-core
// logs each group's parameters and settings when it builds its optimizer).
void announce_optimizer_groups(const TrainContext& ctx) {
  const ParamLayout& whole = ctx.full_layout;
  const OptimizerGroups groups(whole, ctx.config.optim);
  std::vector<int64_t> tensors(groups.count()), elements(groups.count());
  for (size_t i = 0; i < whole.specs().size(); ++i) {
    if (whole.specs()[i].is_buffer) continue;
    ++tensors[groups.group_of(i)];
    elements[groups.group_of(i)] += static_cast<int64_t>(whole.specs()[i].numel);
  }
  for (size_t g = 0; g < groups.count(); ++g) {
    const GroupSettings& s = groups.settings(g);
    ctx.progress.message(
        fmt::format("optimizer group {}: {} tensors, {:.2f}M parameters; lr {}, weight_decay {}{}, "
                    "betas ({}, {}), eps {}",
                    g == 0 ? std::string("of the tensors no override names")
                           : fmt::format("optim.group_overrides[{}]", g - 1),
                    tensors[g], static_cast<double>(elements[g]) / 1e6, s.lr, s.weight_decay,
                    s.weight_decay_given ? "" : " (none on the tensors optim.no_decay exempts)",
                    s.beta1, s.beta2, s.eps));
  }
}

// The start-up lines: the model and data, and the parallel layout.
void announce(const TrainContext& ctx, const RunInputs& in, const StartPoint& start,
              const TrainOptions& options, const std::vector<int64_t>& chunk_layers,
              const CommunicatorChoice& communicator) {
  const TrainConfig& tc = ctx.config.train;
  const ParallelConfig& pc = ctx.config.parallel;
  const double dense = static_cast<double>(ctx.layout.numel(ParamGroup::kDense)) / 1e6;
  const double expert = static_cast<double>(ctx.layout.numel(ParamGroup::kExpert)) / 1e6;
  ctx.progress.message(fmt::format(
      "moecore train: {:.2f}M parameters ({:.2f}M dense, {:.2f}M expert), {}, {} GEMMs{}, "
      "{} train instances of {} tokens{}{}{}",
      dense + expert, dense, expert,
      tc.device == Device::kCpu
          ? fmt::format("{} threads", omp_get_max_threads())
          : fmt::format("on {} {}", device_name(tc.device),
                        options.device_description.empty() ? "(device not described)"
                                                           : options.device_description),
      gemm_precision_line(tc),
      tc.cuda_grouped_gemm == CudaGroupedGemm::kOneLaunch
          ? " (the routed experts' in one launch each, offsets on the device)"
          : "",
      in.train_data.num_instances(), tc.seq_len,
      ctx.config.data.order == data::OrderRule::kOlmoCore
          ? fmt::format(" in OLMo-core's order ({} per epoch)", ctx.loader.order().epoch_length())
          : "",
      in.document_eos < 0          ? std::string()
      : ctx.config.data.bos_id < 0 ? fmt::format(", document masking (EOS {})", in.document_eos)
                                   : fmt::format(", document masking (EOS {} followed by BOS {})",
                                                 in.document_eos, ctx.config.data.bos_id),
      start.checkpoint ? fmt::format(", resumed from {} (step {})", *start.checkpoint, ctx.step)
      : options.init_from.empty() ? ""
                                  : fmt::format(", initialised from {}", options.init_from)));
  if (ctx.config.data.instance_filter) {
    const data::RepetitionFilter& r = ctx.config.data.repetition;
    ctx.progress.message(fmt::format(
        "instance filter: a training instance repeating a period of {}-{} tokens {} times or "
        "more is masked (OLMo-core's InstanceFilterConfig; its labels count as zero-loss tokens)",
        r.min_period, r.max_period, r.max_count));
  }
  if (!ctx.config.optim.group_overrides.empty()) announce_optimizer_groups(ctx);
  if (tc.has_batch_size_schedule()) {
    std::string steps;
    for (size_t i = 0; i < tc.batch_sizes.size(); ++i)
      steps += fmt::format("{}{} from {}", i == 0 ? "" : ", ", tc.batch_sizes[i],
                           tc.batch_size_starts[i]);
    ctx.progress.message(fmt::format(
        "batch size schedule: {} {} (sequences; micro-batches of {}); in force: {} sequences, "
        "the learning-rate schedule's initial_lr {}",
        steps, batch_size_units_name(tc.batch_size_units), tc.batch_size / tc.microbatches,
        tc.batch_size, ctx.initial_lr));
  }
  if (tc.seq_len_warmup_steps > 0 && ctx.step < tc.seq_len_warmup_steps) {
    // Melting, OLMo-core's callback multiplies a micro-batch's tokens by the pieces (up to the
    // whole rank batch): the first update's are the most, and its activations grow with them.
    const int64_t local_rows = ctx.rows / ctx.mesh.dp.size();
    const WarmupShape first = warmup_shape(tc, tc.microbatches, local_rows, ctx.step + 1);
    const int64_t factor = first.rows * first.seq / (local_rows * tc.seq_len);
    ctx.progress.message(fmt::format(
        "sequence-length warm-up: updates {}-{} from {} to {} tokens a row ({}){}", ctx.step + 1,
        tc.seq_len_warmup_steps, first.seq, tc.seq_len,
        tc.seq_len_warmup_truncate ? "truncated" : "melted",
        factor > 1 ? fmt::format("; its micro-batches hold up to {} x the tokens of the run's, as "
                                 "OLMo-core's callback makes them, and their activations' memory "
                                 "with them (`moecore plan` counts them)",
                                 factor)
                   : ""));
  }
  if (tc.max_tokens > 0) announce_max_tokens(ctx);
  if (ctx.last_step < tc.max_steps)
    ctx.progress.message(fmt::format("hard stop: {}: the run stops at step {} of its {}",
                                     hard_stop_text(tc), ctx.last_step, tc.max_steps));
  if (tc.max_epochs > 0)
    ctx.progress.message(
        fmt::format("length: train.max_epochs={} of {} instances: {}", tc.max_epochs,
                    ctx.loader.order().epoch_length(),
                    remaining_updates(ctx, fmt::format("{} sequences", tc.batch_size))));
  if (ctx.world.size() > 1)
    ctx.progress.message(fmt::format(
        "parallel: {} ranks, dp={} ep={} zero={}; optimizer state {:.2f} MiB per rank{}; "
        "communicator {}",
        ctx.world.size(), ctx.mesh.dp.size(), pc.ep, pc.zero,
        static_cast<double>(ctx.optimizer.state_floats()) * 4.0 / (1 << 20),
        ctx.rowwise_dispatch
            ? fmt::format("; rowwise dispatch{}, capacity_factor {}",
                          pc.rowwise_transport == RowwiseTransport::kPadded
                              ? " (padded all-to-all, planned where the model is)"
                          : pc.rowwise_transport == RowwiseTransport::kSymmetric
                              ? " (padded blocks stored into symmetric memory by the device)"
                          : tc.device == Device::kCpu ? ""
                                                      : " (all-to-all-v on the device)",
                          pc.capacity_factor)
            : std::string(),
        communicator.description));
  else if (communicator.device != nullptr)
    ctx.progress.message(
        fmt::format("parallel: 1 rank; communicator {}", communicator.description));
  if (pc.pp > 1) {
    std::string split;
    for (int64_t n : chunk_layers) split += (split.empty() ? "" : ", ") + std::to_string(n);
    ctx.progress.message(fmt::format(
        "pipeline: pp={} schedule={} virtual_stages={} microbatches={}; layers per chunk [{}]",
        pc.pp,
        pc.schedule == PipelineSchedule::kOneFOneB      ? "1f1b"
        : pc.schedule == PipelineSchedule::kInterleaved ? "interleaved-1f1b"
                                                        : "gpipe",
        resolve_virtual_stages(pc), tc.microbatches, split));
  }
}

// The step's micro-batches: every rank reads the whole global batch (the data cursor stays
// layout-free) and keeps its slice of `local_rows` sequences from token `slice_begin` on.
struct StepBuffers {
  StepBuffers(int64_t microbatches, int64_t rows, int64_t begin)
      : tokens(static_cast<size_t>(microbatches)),
        targets(static_cast<size_t>(microbatches)),
        local_rows(rows),
        slice_begin(begin) {}
  std::vector<std::vector<int32_t>> tokens, targets;
  int64_t local_rows, slice_begin;
  // data.instance_filter: each micro-batch's rows the filter masked (1), every rank's.
  std::vector<std::vector<uint8_t>> masked{};
  // Under a sequence-length warm-up, the cut batch's micro-batches in the same layout (every
  // rank's rows, rank after rank), a cut row masked where its instance is.
  std::vector<std::vector<int32_t>> cut_tokens{}, cut_targets{};
  std::vector<std::vector<uint8_t>> cut_masked{};
};

// OLMo-core's sequence-length warm-up (train/seq_len_warmup.h): the step's micro-batches, read
// whole, cut into `shape`'s rows and micro-batches, rank by rank as each rank's train module cuts
// its own batch (its instances in order, each into `pieces` rows, split into micro-batches of
// shape.rows rows: a multiple of the pieces), into batch.cut_tokens / cut_targets in the read
// micro-batches' layout (rank r's rows of cut micro-batch k at r x shape.rows x shape.seq).
void cut_step_batch(StepBuffers& batch, const WarmupShape& shape, int64_t seq_len, int64_t dp) {
  const int64_t m = batch.local_rows;
  const auto read = static_cast<int64_t>(batch.tokens.size());
  const bool filtered = !batch.masked.empty();
  batch.cut_tokens.resize(static_cast<size_t>(shape.micro));
  batch.cut_targets.resize(static_cast<size_t>(shape.micro));
  batch.cut_masked.resize(filtered ? static_cast<size_t>(shape.micro) : 0);
  for (int64_t k = 0; k < shape.micro; ++k) {
    batch.cut_tokens[static_cast<size_t>(k)].resize(
        static_cast<size_t>(dp * shape.rows * shape.seq));
    batch.cut_targets[static_cast<size_t>(k)].resize(
        static_cast<size_t>(dp * shape.rows * shape.seq));
    if (filtered)
      batch.cut_masked[static_cast<size_t>(k)].resize(static_cast<size_t>(dp * shape.rows));
  }
  for (int64_t rank = 0; rank < dp; ++rank)
    for (int64_t j = 0; j < read; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t row = (j * m + i) * shape.pieces;  // the rank's cut row of its first piece
        const auto k = static_cast<size_t>(row / shape.rows);
        const int64_t to = (rank * shape.rows + row % shape.rows) * shape.seq;
        const int64_t from = (rank * m + i) * seq_len;
        cut_for_warmup(shape, seq_len, batch.tokens[static_cast<size_t>(j)].data() + from,
                       batch.targets[static_cast<size_t>(j)].data() + from, 1,
                       batch.cut_tokens[k].data() + to, batch.cut_targets[k].data() + to);
        // OLMo-core's melt_batch repeats the instance mask for each piece (repeat_interleave).
        if (filtered)
          std::fill_n(batch.cut_masked[k].begin() + rank * shape.rows + row % shape.rows,
                      shape.pieces,
                      batch.masked[static_cast<size_t>(j)][static_cast<size_t>(rank * m + i)]);
      }
}

// What the step's work reads that the host computes anew for every step, staged where the
// parameters are before the work (a replayed step graph reads them there): AdamW's coefficients
// at the step's learning rate, which `report` gets, and the step guard's limits.
void stage_step_scalars(TrainContext& ctx, Device device, StepReport& report) {
  const TrainConfig& tc = ctx.config.train;
  report.lr = learning_rate(ctx.config.optim, ctx.step, tc.max_steps, tc.batch_size * tc.seq_len,
                            token_origin(ctx.replay_origin), tc.max_tokens, ctx.initial_lr);
  // Every optimizer group's rate: the schedule at the group's initial_lr (its lr, moved by the
  // batch-size changes as optim.lr is), as OLMo-core's scheduler sets each group's.
  const OptimizerGroups& groups = ctx.optimizer.groups();
  report.group_lrs.assign(1, report.lr);
  for (size_t g = 1; g < groups.count(); ++g)
    report.group_lrs.push_back(
        learning_rate(ctx.config.optim, ctx.step, tc.max_steps, tc.batch_size * tc.seq_len,
                      token_origin(ctx.replay_origin), tc.max_tokens,
                      scheduled_initial_lr(groups.settings(g).lr, ctx.batch_size_history)));
  ctx.optimizer.stage_step(report.group_lrs);
  const StepLimits limits = ctx.guard.limits();
  const std::array<double, 2> values{limits.loss, limits.grad_norm};
  ctx.step_limits.place_on(device);
  ctx.step_limits.resize_for_overwrite(values.size());
  copy_bytes(ctx.step_limits.data(), values.data(), sizeof(values));
}

// The loss the step guard judges: the step's whole loss, or under OLMo-core's rule its
// cross-entropy (OLMo-core's skip-step optimizer reads its CE batch loss), with the other parts
// times 0 so that it is not finite exactly where step_decision's sum of the same rows with those
// coefficients at 0 is not.
double judged_loss(const TrainConfig& tc, const LossParts& loss) {
  if (tc.skip_rule != SkipRule::kOlmoCore) return loss.total;
  return loss.ce + 0.0 * loss.lb + 0.0 * loss.z + 0.0 * loss.lm_z;
}

// The optimizer step after the passes, decided where the gradients are (kernels::step_decision:
// the spike guard's test with the staged limits and the clipping coefficient), so that the update
// never waits for the host to read the loss and the norm (issue 15 item 3); read_decision() reads
// them once the step is issued. Losses and the norm are global (identical on every rank): every
// rank decides the same. With one pipeline stage this issues work only (a step graph captures
// it); with several the stages' losses are summed on the host first, into `report`.
void decide_and_update(TrainContext& ctx, ParamBuffers& grads, float loss_scale,
                       StepReport& report) {
  const ParallelConfig& pc = ctx.config.parallel;
  // The loss: with one stage, each micro-batch's loss parts as the passes left them; with
  // several, each stage holds its layers' share, summed over the stages on the host and handed
  // over as one row that holds the total.
  const Device device = grads.dense.device();
  ConstTensorView loss_rows;
  StepDecisionOptions decide{.max_grad_norm = ctx.config.optim.max_grad_norm,
                             .lb_coef = ctx.config.model.router_aux_loss_coef,
                             .z_coef = ctx.config.model.router_z_loss_coef,
                             .lm_z_coef = ctx.config.train.z_loss_multiplier,
                             .loss_scale = loss_scale};
  if (ctx.config.train.skip_rule == SkipRule::kOlmoCore)
    decide.lb_coef = decide.z_coef = decide.lm_z_coef = 0.0;  // judged: the cross-entropy
  if (pc.pp > 1) {
    report.loss = ctx.pipeline.read_losses();
    double parts[5] = {report.loss.ce, report.loss.lb, report.loss.z, report.loss.lm_z,
                       report.loss.total};
    ctx.mesh.pp.allreduce_sum(parts, 5);
    report.loss = {parts[0], parts[1], parts[2], parts[3], parts[4], report.loss.counted_tokens};
    std::array<double, kernels::kLossParts> row{};
    row[kernels::kCeLoss] = judged_loss(ctx.config.train, report.loss);
    ctx.stage_loss_row.place_on(device);
    ctx.stage_loss_row.resize_for_overwrite(row.size());
    copy_bytes(ctx.stage_loss_row.data(), row.data(), sizeof(row));
    loss_rows = view(ctx.stage_loss_row.data(), {1, kernels::kLossParts});
    decide.lb_coef = decide.z_coef = decide.lm_z_coef = 0.0;
    decide.loss_scale = 1.0;
  } else {
    MOE_CHECK(ctx.chunks.size() == 1, "[parallel] one pipeline stage runs one model chunk");
    loss_rows = ctx.chunks.front()->recorded_losses();
  }
  // The first chunk's workspace, idle between the passes, lends ZeRO-1 its reduction buffers.
  Workspace& scratch = ctx.chunks.front()->workspace();
  const ConstTensorView squares = ctx.optimizer.reduce_gradients(grads, scratch);
  ctx.decision.place_on(device);
  ctx.decision.resize_for_overwrite(3);
  ctx.step_factors.place_on(device);
  ctx.step_factors.resize_for_overwrite(2);
  const TensorView factors = view(ctx.step_factors.data(), {2});
  kernels::step_decision(loss_rows, squares, decide, view(ctx.step_limits.data(), {2}),
                         view(ctx.decision.data(), {3}), factors);
  ctx.optimizer.step(ctx.params, grads, factors, scratch);
  // Auxiliary-loss-free balancing: each chunk's tally is the global batch's (summed over dp with
  // the batch statistics, or per rank (lb_terms_per_rank) by update_router_bias), so every rank
  // applies the same update to its copy. The chunks' bf16 weight copies are remade at the next
  // forward, once for the whole step.
  for (Transformer* chunk : ctx.chunks) {
    chunk->update_router_bias(ctx.params, factors);
    chunk->weights_changed();
  }
}

// The step's reads, once all of it is issued: its losses and its decision, into `report`; the
// host's guard must decide the same. Returns why the step was skipped, or nothing.
std::string read_decision(TrainContext& ctx, StepReport& report) {
  if (ctx.config.parallel.pp == 1) report.loss = ctx.pipeline.read_losses();
  std::array<double, 3> decided{};
  copy_bytes(decided.data(), ctx.decision.data(), sizeof(decided));
  report.grad_norm = decided[1];
  const double judged = judged_loss(ctx.config.train, report.loss);
  std::string skip_reason = ctx.guard.check(judged, report.grad_norm);
  MOE_CHECK(skip_reason.empty() == (decided[2] == 1.0),
            "[train] step {}: the decision where the gradients are ({}) differs from the step "
            "guard's on the host ({}; loss {} there, {} here)",
            ctx.step + 1, decided[2] == 1.0 ? "apply" : "skip",
            skip_reason.empty() ? "apply" : skip_reason, decided[0], judged);
  if (!skip_reason.empty()) ctx.optimizer.skipped_step();  // Adam counts applied steps
  return skip_reason;
}

// One optimizer step (or a step the guard skips) over the next global batch, run through this
// rank's pipeline chunks; returns what it produced, with the trainer's scalars. The host stages
// what the step reads, issues its work (or replays it: train.cuda_graph) and reads its results.
StepReport run_step(TrainContext& ctx, ParamBuffers& grads, StepBuffers& batch) {
  const TrainConfig& tc = ctx.config.train;
  const ParallelConfig& pc = ctx.config.parallel;
  StepReport report;
  stage_step_scalars(ctx, grads.dense.device(), report);
  std::vector<PipelineRunner::MicroBatch> micro_batches;
  // Each global micro-batch's counted targets and tokens, from the whole batch every rank reads:
  // the passes need not sum them over dp.
  std::vector<Transformer::BatchCounts> counts;
  const bool filtered = ctx.config.data.instance_filter;
  batch.masked.resize(filtered ? batch.tokens.size() : 0);
  int64_t masked_instances = 0;
  for (size_t micro = 0; micro < batch.tokens.size(); ++micro) {
    ctx.loader.next_batch(ctx.rows, batch.tokens[micro], batch.targets[micro]);
    if (!filtered) continue;
    const std::span<const uint8_t> masked = ctx.loader.masked_rows();
    batch.masked[micro].assign(masked.begin(), masked.end());
    masked_instances += std::count(masked.begin(), masked.end(), uint8_t{1});
  }
  const auto read_instances = static_cast<int64_t>(batch.tokens.size()) * ctx.rows;
  if (filtered && masked_instances == read_instances)
    ctx.progress.message(
        fmt::format("warning: step {}: the instance filter masks every instance of the batch (its "
                    "cross-entropy is 0, as OLMo-core's)",
                    ctx.step + 1));
  // A sequence-length warm-up's update trains the batch cut into its shape's rows and
  // micro-batches (train/seq_len_warmup.h); after it, the batch as read.
  const WarmupShape shape = warmup_shape(tc, tc.microbatches, batch.local_rows, ctx.step + 1);
  if (shape.cut) cut_step_batch(batch, shape, tc.seq_len, ctx.mesh.dp.size());
  if (tc.seq_len_warmup_steps > 0 && shape.seq != ctx.warmup_seq_len) {
    ctx.progress.message(
        fmt::format("sequence length: {} from update {} ({}; {} micro-batch(es) of {} rows a rank)",
                    shape.seq, ctx.step + 1,
                    !shape.cut ? "the warm-up is over"
                    : tc.seq_len_warmup_truncate
                        ? fmt::format("each instance truncated to its first {} tokens", shape.seq)
                        : fmt::format("each instance melted into {} rows", shape.pieces),
                    shape.micro, shape.rows));
    ctx.warmup_seq_len = shape.seq;
  }
  if (ctx.pipeline.microbatches() != shape.micro) ctx.pipeline.set_microbatches(shape.micro);
  const std::vector<std::vector<int32_t>>& step_tokens =
      shape.cut ? batch.cut_tokens : batch.tokens;
  const std::vector<std::vector<int32_t>>& step_targets =
      shape.cut ? batch.cut_targets : batch.targets;
  const std::vector<std::vector<uint8_t>>& step_masked =
      shape.cut ? batch.cut_masked : batch.masked;
  const int64_t slice_begin =
      shape.cut ? ctx.mesh.dp.rank() * shape.rows * shape.seq : batch.slice_begin;
  // OLMo-core's OLMoDDP train module divides every micro-batch's loss by the whole batch's
  // labels (its batch_num_tokens_for_loss, summed over dp and divided by the dp size, DDP then
  // averaging the ranks) and adds the micro-batches up; moecore averages its micro-batches
  // (loss_scale 1 / M), so each divides by the global batch's count / M: its own count where
  // every micro-batch holds as many labels, OLMo-core's division where label masks make them
  // differ. A masked instance's labels count anyway, as zero-loss tokens (masked x (row length
  // - 1)): the step's loss reads lower by the masked share. (Its TransformerTrainModule adds
  // masked x row length to a rank's own count, its pipeline module nothing: README,
  // data.instance_filter.)
  double batch_divisor = 0.0;
  for (size_t micro = 0; micro < step_tokens.size(); ++micro) {
    const std::vector<int32_t>& targets = step_targets[micro];
    counts.push_back(
        {std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; }),
         static_cast<int64_t>(targets.size())});
    batch_divisor += static_cast<double>(counts.back().counted_targets);
    if (filtered)
      batch_divisor += static_cast<double>(
          std::count(step_masked[micro].begin(), step_masked[micro].end(), uint8_t{1}) *
          (shape.seq - 1));
  }
  // OLMo-core clamps the count to 1 (a batch without a label then keeps its router losses).
  batch_divisor = std::max(batch_divisor, 1.0) / static_cast<double>(step_tokens.size());
  for (size_t micro = 0; micro < step_tokens.size(); ++micro) {
    Transformer::BatchCounts& count = counts[micro];
    count.divisor = batch_divisor;
    PipelineRunner::MicroBatch slice{step_tokens[micro].data() + slice_begin,
                                     step_targets[micro].data() + slice_begin};
    if (ctx.step_graph) {  // the graph's static inputs in device memory
      const auto m = static_cast<int64_t>(micro);
      ctx.step_graph->stage(m, slice.tokens, slice.targets, count.counted_targets, count.divisor);
      slice = {ctx.step_graph->tokens(m), ctx.step_graph->targets(m)};
      count.divisor_on_device = ctx.step_graph->divisor(m);
    }
    micro_batches.push_back(slice);
  }
  const bool overlap = pc.overlap_grad_reduce && ctx.mesh.dp.size() > 1;
  auto pass_hook = [&](Transformer& chunk, bool forward, int64_t micro, bool done) {
    if (forward && !done) {
      chunk.set_routing_seed(routing_forward_seed(tc.seed, ctx.step, micro));  // model.routing
      chunk.set_routing_token_offset(slice_begin);
      chunk.set_next_batch_counts(counts[static_cast<size_t>(micro)]);
      // A step graph's ids are in device memory: it found the documents when it staged them.
      if (ctx.step_graph) chunk.set_next_document_starts(ctx.step_graph->document_starts(micro));
    } else if (!forward && !done) {
      // Overlap: during the last micro-batch's backward, each layer's gradients start their
      // all-reduce as soon as they are final.
      chunk.set_layer_grads_ready(overlap && micro + 1 == shape.micro
                                      ? Transformer::LayerGradsReady([&](int64_t layer) {
                                          ctx.optimizer.start_layer_reduce(grads, layer);
                                        })
                                      : Transformer::LayerGradsReady());
    }
  };
  const float loss_scale = 1.0f / static_cast<float>(shape.micro);
  // The step's work: nothing in it reads the device back with one pipeline stage.
  auto issue = [&] {
    grads.zero();
    for (Transformer* chunk : ctx.chunks) chunk->clear_selection_counts();  // evaluations counted
    ctx.pipeline.train_step(ctx.params, grads, micro_batches, shape.rows, shape.seq, loss_scale,
                            pass_hook);
    decide_and_update(ctx, grads, loss_scale, report);
  };
  if (ctx.step_graph)
    ctx.step_graph->run(issue, ctx.chunks);
  else
    issue();
  const std::string skip_reason = read_decision(ctx, report);
  if (!skip_reason.empty()) {
    ctx.progress.message(
        fmt::format("warning: step {} skipped ({}); weights unchanged", ctx.step + 1, skip_reason));
  }
  report.step = ++ctx.step;
  ctx.tokens_seen += tc.batch_size * tc.seq_len;
  report.seconds = ctx.seconds();
  report.tokens_per_s = static_cast<double>(ctx.tokens_seen - ctx.start_tokens) / report.seconds;
  report.log_step = ctx.step % tc.log_every == 0 || ctx.step == ctx.last_step;
  report.scalars = {{"train/loss", report.loss.total},
                    {"train/ce", report.loss.ce},
                    {"train/lb", report.loss.lb},
                    {"train/z", report.loss.z},
                    {"train/lm_z", report.loss.lm_z},
                    {"train/grad_norm", report.grad_norm},
                    {"train/lr", report.lr},
                    {"train/tokens_per_s", report.tokens_per_s},
                    {"train/tokens_seen", static_cast<double>(ctx.tokens_seen)},
                    {"train/skipped_steps", static_cast<double>(ctx.guard.skipped())}};
  // OLMo-core's StabilityMonitorCallback's "spike/SpikeScore" and "spike/SpikeScore (total)".
  const SpikeMonitor::Scores spike_scores = ctx.spikes.observe(report.loss.ce, report.grad_norm);
  if (spike_scores.running) report.scalars.emplace_back("train/spike_score", *spike_scores.running);
  if (spike_scores.total)
    report.scalars.emplace_back("train/spike_score_total", *spike_scores.total);
  // Each group override's rate (OLMo-core's "optim/LR (group k)", whose numbers depend on its
  // optimizer's order of the groups); train/lr is the rest's.
  for (size_t g = 1; g < report.group_lrs.size(); ++g)
    report.scalars.emplace_back(fmt::format("train/lr_override{}", g - 1), report.group_lrs[g]);
  if (tc.seq_len_warmup_steps > 0)
    report.scalars.emplace_back("train/seq_len", static_cast<double>(shape.seq));
  // OLMo-core's "train/masked instances (%)": the batch's share of masked instances (a fraction).
  if (filtered)
    report.scalars.emplace_back("train/masked_instances", static_cast<double>(masked_instances) /
                                                              static_cast<double>(read_instances));
  // OLMo-core's BatchSizeSchedulerCallback records its global batch size each step ("train/global
  // batch size", in tokens; here in sequences).
  if (tc.has_batch_size_schedule())
    report.scalars.emplace_back("train/batch_size", static_cast<double>(tc.batch_size));
  if (pc.pp > 1) {
    // Pipeline bubble: the mean over the stages of the time spent waiting for a neighbour.
    double bubble = ctx.pipeline.step_seconds() > 0.0
                        ? ctx.pipeline.idle_seconds() / ctx.pipeline.step_seconds()
                        : 0.0;
    ctx.mesh.pp.allreduce_sum(&bubble, 1);
    report.scalars.emplace_back("pipeline/bubble", bubble / static_cast<double>(pc.pp));
    report.scalars.emplace_back("pipeline/peak_live_microbatches",
                                static_cast<double>(ctx.pipeline.peak_live()));
  }
  if (ctx.step == ctx.summary.start_step + 1) ctx.summary.first_loss = report.loss.ce;
  ctx.summary.last_loss = report.loss.ce;
  return report;
}

// Whether the loop ends where an epoch does and OLMo-core's trainer knows it only once its loader
// says so (a length in epochs, or a hard stop in epochs before the run's length): it asks for
// one more batch there, before which its batch size schedule may halve the batch and read the
// epoch's tail.
bool ends_when_the_epoch_does(const TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  return (tc.max_epochs > 0 && ctx.last_step == tc.max_steps) ||
         (tc.hard_stop_epochs > 0 && ctx.last_step < tc.max_steps);
}

// train.batch_sizes: before each update, the change the schedule makes there, if any
// (train/batch_size_schedule.h). `config` (ctx.config) takes the new batch in force, its
// micro-batches and the run's length; the loader goes on where OLMo-core's would, from a new
// replay origin; the schedule's initial_lr and the loop's end move with it.
void apply_batch_size_schedule(TrainContext& ctx, RunConfig& config,
                               const data::TokenDataset& dataset, StepBuffers& buffers) {
  const TrainConfig& tc = config.train;
  if (!tc.has_batch_size_schedule()) return;
  MOE_CHECK(ctx.loader.cursor() ==
                ctx.replay_origin.data_cursor +
                    static_cast<uint64_t>((ctx.step - ctx.replay_origin.step) * tc.batch_size),
            "[train] step {}: the data cursor {} is not where the batch in force reads from its "
            "origin",
            ctx.step, ctx.loader.cursor());
  const std::vector<BatchSizeChange> changes =
      scheduled_batch_changes(config, ctx.step, ctx.replay_origin, ctx.batch_size_history, &dataset,
                              ctx.step >= ctx.last_step);
  if (changes.empty()) return;
  for (const BatchSizeChange& change : changes) {
    ctx.batch_size_history.push_back(change.to);
    ctx.progress.message(
        describe_batch_size_change(config, ctx.step, change, ctx.batch_size_history));
    config = change.config;
  }
  ctx.initial_lr = scheduled_initial_lr(config.optim.lr, ctx.batch_size_history);
  ctx.replay_origin = changes.back().origin;
  ctx.loader = training_loader(config, dataset, ctx.replay_origin.data_cursor, ctx.mesh.dp.size());
  // (run_step gives the pipeline each step's micro-batch count)
  buffers.tokens.resize(static_cast<size_t>(tc.microbatches));
  buffers.targets.resize(static_cast<size_t>(tc.microbatches));
  ctx.last_step = last_step_with_data(config, dataset, ctx.replay_origin);
  ctx.progress.set_max_steps(ctx.last_step);
}

// Where a fine-tune from a Hugging Face model trains another objective than transformers would on
// the same config.json (its loss adds router_aux_loss_coef times its own load-balancing loss only
// when output_router_logits is true), a start-up line says so and how to match it.
std::string init_from_objective_note(const ModelConfig& mc, const io::HfModelInfo& info,
                                     const std::string& hf_dir) {
  // moecore's own architectures (the family its export would name): no transformers class.
  if (mc.router_aux_loss_coef == 0.0 || io::hf_config_json(mc, info).at("model_type") == "moecore")
    return "";
  if (!info.output_router_logits)
    return fmt::format(
        "note: {}/config.json says output_router_logits = false, so transformers fine-tunes it on "
        "cross-entropy alone; this run adds the load-balancing loss (model.router_aux_loss_coef = "
        "{}; 0 trains as transformers does)",
        hf_dir, mc.router_aux_loss_coef);
  if (mc.lb_loss_style != LbLossStyle::kHf)
    return fmt::format(
        "note: the load-balancing loss is OLMo-core's form (per layer, summed over the layers); "
        "transformers adds its own form for {} (model.lb_loss_style = \"hf\" trains as it does)",
        hf_dir);
  return "";
}

// --init-from: every rank reads its part of the Hugging Face model (rank 0 the whole model, for
// the self-check), so any layout starts from the single process's weights. Then, before the first
// step and before anything but the lock is in out_dir, rank 0 writes them as this run's checkpoints
// will be (fp32 weights, config.json, config.toml), reads them back and compares the logits
// (train/round_trip_check.h); returns the start-up line that says so.
std::string init_from_hf(const dist::Communicator& world, const RunConfig& config,
                         const RunInputs& in, const std::string& hf_dir,
                         const ParamLayout& full_layout, const ParamLayout& layout,
                         ParamBuffers& params) {
  // Rank 0 reads the whole model, for its self-check; every other rank reads only its share.
  std::optional<ParamBuffers> whole;
  if (world.rank() == 0) {
    whole.emplace(full_layout);
    io::read_hf_weights(full_layout, hf_dir, *whole);
    dist::take_local(full_layout, *whole, layout, params);
  } else {
    io::read_hf_weights_share(full_layout, hf_dir, layout, params);
  }
  const std::optional<int32_t> eos =
      in.tokenizer ? std::optional<int32_t>(in.tokenizer->eos_id()) : std::nullopt;
  const RoundTripCheck check = round_trip_check_on_rank0(
      world, config.train.out_dir + "/.init-from-check", full_layout, whole ? &*whole : nullptr,
      {&config, io::hf_config_json(config.model, config.train.seq_len, eos), {}, {}, {}},
      "[init-from]");
  return fmt::format(
      "init-from self-check: {} written in moecore's format and read back gives the same logits "
      "bit for bit ({} x {} tokens, max |diff| {:.3g}, max |logit| {:.4g}; {:.1f} s)",
      hf_dir, check.batch, check.seq, check.max_abs_diff, check.max_abs_logit, check.seconds);
}

// The callbacks of a run, in step order (on_end runs in reverse: callback.h): the sample reads
// the final checkpoint, the peak memory is taken before it; the MoE monitor's scalars reach the
// metrics; the stop vote comes before the evaluation it cancels, the checkpoint after it, and a
// stop signal that arrives during the final checkpoint ends the process before the final
// evaluation; the profile and the rank statistics end first, before the final checkpoint; the
// caller's come last.
void add_callbacks(TrainContext& ctx, const RunInputs& in, const TrainOptions& options,
                   int64_t owner_pid, bool resumed, const HfMetadata& metadata) {
  const TrainConfig& tc = ctx.config.train;
  const bool rank0 = ctx.world.rank() == 0;
  // The sample decodes the final checkpoint: none without checkpoints.
  if (in.tokenizer && tc.checkpoint)
    ctx.callbacks.push_back(std::make_unique<SampleCallback>(*in.tokenizer));
  ctx.callbacks.push_back(std::make_unique<PeakMemoryCallback>());
  ctx.callbacks.push_back(std::make_unique<MoeMonitorCallback>());
  ctx.callbacks.push_back(std::make_unique<MetricsCallback>(tc.out_dir, ctx.step, rank0));
  auto stop_signals = std::make_unique<StopSignalCallback>();
  StopSignalCallback& loop_signals = *stop_signals;
  ctx.callbacks.push_back(std::move(stop_signals));
  if (in.evaluates()) {
    auto evaluator = std::make_shared<EvalCallback>(in.val_data ? &*in.val_data : nullptr,
                                                    in.lm_eval ? &*in.lm_eval : nullptr,
                                                    in.lm_eval_documents, std::move(in.downstream));
    // The model merger evaluates its averages with it (ctx outlives the callbacks).
    ctx.evaluate_merged = [&ctx, raw = evaluator.get()](int64_t at) {
      raw->evaluate_merged(ctx, at);
    };
    ctx.callbacks.push_back(std::move(evaluator));
  }
  // Its on_end right after the final checkpoint's, before the final evaluation's.
  ctx.callbacks.push_back(std::make_unique<LateStopSignalCallback>(loop_signals));
  // Before the checkpoint, as OLMo-core orders its merger.
  if (!tc.merge_steps.empty() || tc.merge_interval > 0)
    ctx.callbacks.push_back(std::make_unique<ModelMergeCallback>(
        owner_pid, io::hf_config_json(ctx.config.model, metadata.info),
        in.tokenizer ? in.tokenizer->to_json() : std::string(), metadata.side_files));
  if (tc.checkpoint)
    ctx.callbacks.push_back(std::make_unique<CheckpointCallback>(
        owner_pid, io::hf_config_json(ctx.config.model, metadata.info),
        in.tokenizer ? in.tokenizer->to_json() : std::string(), metadata.side_files,
        resumed ? std::optional<int64_t>(ctx.step) : std::nullopt));
  ctx.callbacks.push_back(std::make_unique<ProfilerCallback>());
  ctx.callbacks.push_back(std::make_unique<RankStatsCallback>());
  ctx.callbacks.insert(ctx.callbacks.end(), options.callbacks.begin(), options.callbacks.end());
}

}  // namespace

TrainSummary train(const RunConfig& config_in, const TrainOptions& options) {
  RunConfig config = config_in;  // the effective config, saved with the run
  const TrainConfig& tc = config.train;
  const ModelConfig& mc = config.model;
  const ParallelConfig& pc = config.parallel;
  // Everything the run allocates for its model (parameters, optimizer state, activations) lives
  // on train.device; what the host reads (checkpoints, metrics, the sample) is copied out of it.
  MOE_CHECK(has_device_memory(tc.device),
            "[train] train.device={}: this process has not selected a {} device (the moecore "
            "program built by the `cuda` preset selects it at start-up)",
            device_name(tc.device), device_name(tc.device));
  const DefaultDeviceScope on_device(tc.device);
  // MPI's world: the job's processes, and the bootstrap of a communicator over the device's
  // memory (parallel.communicator, train/communicator_choice.h).
  const std::unique_ptr<dist::Communicator> mpi = dist::mpi_world();
  // Every rank read its own config and command line: the same, or none starts.
  check_ranks_agree(*mpi, "effective config", run_agreement_text(config, options));
  (void)validate_layout(config, mpi->size());  // `moecore plan`'s checks, before any group
  const CommunicatorChoice communicator = choose_communicator(
      config, mpi->size(), [&mpi](const dist::DeviceCommunicatorFactory& factory) {
        return factory.unusable != nullptr ? factory.unusable(*mpi) : std::string();
      });
  // On NCCL the groups take the device's buffers as they are, and their operations on them are
  // only enqueued on the device's stream (host operands, the statistics and votes, are staged
  // and waited for). Over MPI, ranks on devices reduce, pass activations and exchange expert
  // rows through host copies of the device buffers (dist/communicator.h). The pp group is MPI's
  // either way (a group of one on NCCL: pipeline stages keep a job on MPI,
  // train/communicator_choice.h). The rowwise dispatch's one-sided puts and gets
  // (MPI windows) reach host memory only, so on a device its keep decision drives an
  // all-to-all-v (model/sync_dispatch.h's capacity form) and it makes no window (NCCL has none).
  const std::unique_ptr<dist::Communicator> device_world =
      communicator.device != nullptr ? communicator.device->create(*mpi, "world") : nullptr;
  const dist::Communicator& world = device_world ? *device_world : *mpi;
  // A step's collectives (the gradients' reduction, ZeRO-1's, the batch statistics', the
  // experts' exchange) are captured with its kernels on a device communicator only; MPI runs
  // them on the host at the call.
  MOE_CHECK(!tc.cuda_graph || world.size() == 1 || world.capturable(),
            "[config] train.cuda_graph=true with {} processes needs the device's communicator "
            "(parallel.communicator=\"nccl\"; this job's: {}): MPI's collectives run on the "
            "host, which a device graph cannot capture",
            world.size(), communicator.description);
  const dist::Mesh mesh =
      dist::Mesh::build(world, pc.ep, pc.pp, device_world ? mpi.get() : nullptr);
  const bool rank0 = world.rank() == 0;
  const int64_t dp = mesh.dp.size();
  // Pipeline: the model chunks this rank runs (one, the whole model, without pipelining).
  const std::vector<int64_t> chunk_layers =
      dist::split_layers(mc.num_hidden_layers, pc.pp * resolve_virtual_stages(pc), pc.stage_layers);
  const std::vector<LayerRange> my_chunks = dist::stage_chunks(chunk_layers, pc.pp, mesh.stage());
  set_threads(tc.threads, world.size());
  const int64_t rows = tc.batch_size / tc.microbatches;  // per micro-batch, all ranks together
  MOE_CHECK(rows % dp == 0,
            "[parallel] train.batch_size / train.microbatches = {} sequences per micro-batch do "
            "not split over dp={} ranks",
            rows, dp);
  const RunInputs in = open_inputs(config);
  // A length in epochs is known once the training set is read.
  if (tc.max_epochs > 0) config.train.max_steps = max_steps_for_epochs(config, in.train_data);
  // The schedule's checks of a fresh run's length where loading the config could not make them
  // (a --resume's config is read as ScheduleLength::kResumed, a length in epochs was unknown),
  // before anything is written; choose_start makes a resume's over its real length.
  if (options.resume ? list_checkpoints(tc.out_dir).empty() : tc.max_epochs > 0)
    validate_lr_schedule(config.optim, tc.max_steps, tc.batch_size * tc.seq_len, {}, tc.max_tokens,
                         tc.max_epochs);
  // And its own token files: the same global batches on every rank. The training set's
  // fingerprint is also what the checkpoints record and a resume compares (choose_start).
  const data::DatasetFingerprint train_fingerprint = data::dataset_fingerprint(in.train_data);
  check_ranks_agree(*mpi, "training data",
                    dataset_agreement_text(in.train_data, train_fingerprint));
  if (in.val_data)
    check_ranks_agree(
        *mpi, "validation data",
        dataset_agreement_text(*in.val_data, data::dataset_fingerprint(*in.val_data)));
  // The whole model (checkpoints, the sample) and what this rank holds (its layers, its experts).
  const ParamLayout full_layout = ParamLayout::build(mc);
  const ParamLayout layout = ParamLayout::build(mc, pc.ep, mesh.ep.rank(), my_chunks);
  // The group overrides' patterns against every tensor of the model, whichever part this rank
  // holds (OLMo-core's strict build: a pattern that matches nothing is a mistake).
  OptimizerGroups(full_layout, config.optim, /*whole_model=*/true);
  if (!options.init_from.empty()) io::check_hf_weights(full_layout, options.init_from);
  // Rank 0 holds the run directory's lock until the run ends (the kernel drops it if the process
  // dies), taken before anything there is touched: a second trainer started at the same instant
  // is refused before it can delete or write anything.
  std::optional<io::RunDirLock> run_lock;
  int64_t owner_pid = ::getpid();  // rank 0's: the staging directories' names
  if (rank0) {
    std::error_code ec;
    std::filesystem::create_directories(tc.out_dir, ec);
    MOE_CHECK(!ec, "[train] cannot create output directory '{}': {}", tc.out_dir, ec.message());
    run_lock.emplace(io::RunDirLock::acquire(tc.out_dir));
    remove_interrupted_saves(tc.out_dir);
    remove_interrupted_saves(tc.out_dir + "/merged");  // a merged checkpoint's (model_merger.h)
    remove_interrupted_writes(tc.out_dir);
    if (tc.checkpoint) check_checkpoints_dir(tc.out_dir);
  }
  world.broadcast(&owner_pid, sizeof(owner_pid), 0);
  world.barrier();  // the other ranks read the run directory only once rank 0 has tidied it
  const StartPoint start =
      choose_start(world, config, full_layout, options, in.train_data, train_fingerprint);
  config.train.max_steps = start.max_steps;  // a resume's under train.max_tokens or max_epochs
  // What config.toml and the checkpoints record; `config` holds the batch in force from here
  // (train.batch_sizes moves it, with microbatches and max_steps).
  const RunConfig given_config = config;
  config = with_batch_size(config, start.batch_size_history.back());

  ParamBuffers params(layout), grads(layout);
  // Per-name streams: the same weights in any layout.
  init_params(layout, config.model, tc.init, tc.weights_seed(), params);
  // Expert-parallel dispatch. With ep = 1 every expert is local and nothing moves, so `rowwise`
  // is the plain dropless local path there (parallel.capacity_factor only applies to ep > 1).
  // The rowwise dispatch's transport: windows (or, on a device, the capacity form's all-to-all-v),
  // or the padded blocks planned where the model is, moved by an all-to-all or (symmetric) stored
  // by the device into the peers' symmetric memory.
  const dist::AllToAllExchange sync_exchange(mesh.ep);
  const bool rowwise = pc.ep > 1 && pc.dispatch == Dispatch::kRowwise;
  std::optional<dist::WindowRowwiseExchange> rowwise_exchange;
  std::optional<dist::PaddedAllToAllExchange> padded_exchange;
  if (rowwise && moves_padded_blocks(pc.rowwise_transport))
    padded_exchange.emplace(mesh.ep, pc.capacity_factor,
                            pc.rowwise_transport == RowwiseTransport::kSymmetric
                                ? dist::PaddedAllToAllExchange::Blocks::kDeviceStores
                                : dist::PaddedAllToAllExchange::Blocks::kAllToAll);
  else if (rowwise)
    rowwise_exchange.emplace(mesh.ep, mesh.dp, pc.capacity_factor);  // windows on the stage
  const ExpertExchange* exchange = nullptr;
  if (padded_exchange)
    exchange = &*padded_exchange;
  else if (rowwise_exchange)
    exchange = &*rowwise_exchange;
  else if (pc.ep > 1)
    exchange = &sync_exchange;
  // Batch statistics of the global batch: summed over this stage's data-parallel ranks.
  const Transformer::BatchSum dp_batch_sum =
      dp > 1 ? Transformer::BatchSum([&mesh](void* values, int64_t count, DType type) {
        MOE_CHECK(type == DType::kF64 || type == DType::kI64,
                  "[parallel] batch statistics are f64 or i64, got {}", dtype_name(type));
        mesh.dp.allreduce(values, count,
                          type == DType::kF64 ? dist::CommType::kFloat64 : dist::CommType::kInt64,
                          dist::ReduceOp::kSum);
      })
             : Transformer::BatchSum();
  std::vector<std::unique_ptr<Transformer>> chunks;
  std::vector<Transformer*> chunk_ptrs;
  for (const LayerRange& range : my_chunks) {
    chunks.push_back(std::make_unique<Transformer>(mc, layout, exchange, range));
    chunk_ptrs.push_back(chunks.back().get());
    chunks.back()->set_batch_sum(dp_batch_sum);
    chunks.back()->set_document_masking(in.document_eos, document_masking_bos(config.data));
    chunks.back()->set_recompute(tc.recompute);
    chunks.back()->set_lm_head_chunk_tokens(tc.lm_head_chunk_tokens);
    chunks.back()->set_z_loss_multiplier(tc.z_loss_multiplier);
    chunks.back()->set_precision(PrecisionRecipe::from_train(tc.precision, tc.mxfp8));
    // This loop tells the chunks of every change of the weights (each optimizer step, below the
    // loads): their bf16 weight copies are made once per step, not once per micro-batch.
    chunks.back()->set_weight_copy_refresh(Transformer::WeightCopyRefresh::kOnWeightsChanged);
  }
  PipelineRunner pipeline(mesh, chunk_ptrs, pc.schedule, tc.microbatches);
  dist::DistributedOptimizer optimizer(layout, config.optim, mesh, pc.zero == 1);
  MOE_CHECK(!pc.overlap_grad_reduce || pc.zero == 0,
            "[parallel] parallel.overlap_grad_reduce needs parallel.zero=0 (ZeRO-1 reduce-scatters "
            "the whole gradient after the backward)");
  StepGuard guard({tc.skip_sigma, tc.skip_window, tc.skip_min_window, tc.skip_rule});
  GerrymanderingDetector gerrymandering({tc.gerrymander_window, tc.gerrymander_threshold});
  SpikeMonitor spikes(
      {tc.stability_monitor, tc.spike_window, tc.spike_rolling_window, tc.spike_threshold_std});
  TrainerState resumed;
  if (start.checkpoint) {
    resumed = restore_checkpoint(*start.checkpoint, start.saved_config->train, mc, full_layout,
                                 layout, params, optimizer, guard, gerrymandering, spikes,
                                 resets_moments(*start.saved_config, config));
  }
  const std::string init_check_line =
      options.init_from.empty() || start.checkpoint
          ? std::string()
          : init_from_hf(world, config, in, options.init_from, full_layout, layout, params);
  MOE_CHECK(resumed.step <= tc.max_steps,
            "[train] --resume: {} is at step {}, past train.max_steps={}: raise train.max_steps "
            "to continue the run",
            start.checkpoint.value_or(""), resumed.step, tc.max_steps);
  for (Transformer* chunk : chunk_ptrs) chunk->weights_changed();  // loaded or initialised
  // Every rank reads the same global batches in the same order and keeps its slice, so the data
  // cursor, and with it every checkpoint, does not depend on the layout (under OLMo-core's order
  // which instance is whose does, as in OLMo-core).
  const uint64_t data_cursor = start.position.cursor;  // 0 for a fresh run
  // Where the batch in force took over: the checkpoint's, or where a resume changed the replay.
  const ReplayOrigin replay_origin =
      resumed_replay_origin(resumed, start.config_changed, start.position);
  // A finished run resumed: below, nothing is trained or written.
  // Where the loop ends: train.max_steps, or a hard stop before it (counted in tokens or epochs
  // from where the current batch took over).
  const int64_t end_step = last_step_with_data(config, in.train_data, replay_origin);
  const bool finished = start.checkpoint && resumed.step >= end_step;
  // A run killed between committing a checkpoint and pruning the old ones left one too many.
  // Pruned only now, every rank's checkpoint read and every start-up check passed: a refused
  // resume, and a finished one (which writes nothing), delete nothing.
  if (start.checkpoint && !finished) {
    if (rank0) prune_checkpoints(tc.out_dir, *start.checkpoint, tc.keep_last);
    world.barrier();  // no rank looks at the run directory while it prunes
  }
  // Written only once the inputs and the checkpoint are known to fit this config.
  if (rank0 && !finished)
    io::write_text_atomic(tc.out_dir + "/config.toml", run_config_to_toml(given_config), "[train]");
  // The run will save the skipped steps again: each damaged checkpoint is set aside first rather
  // than replaced, what is whole in it kept (a finished run writes nothing, so moves nothing).
  std::vector<std::string> damaged_lines;
  // Every rank knows them; rank 0 moves them and reports (it alone prints).
  if (rank0)
    for (const DamagedCheckpoint& d : start.damaged)
      damaged_lines.push_back(fmt::format(
          "warning: skipped damaged checkpoint {}: {}{}", d.dir, d.reason,
          finished ? "" : fmt::format(" (kept as {})", set_aside_damaged_checkpoint(d.dir))));
  data::DataLoader loader = training_loader(config, in.train_data, data_cursor, mesh.dp.size());
  Progress progress(end_step, tc.log_every, rank0);
  TrainContext ctx{.config = config,
                   .given_config = given_config,
                   .world = world,
                   .mesh = mesh,
                   .progress = progress,
                   .full_layout = full_layout,
                   .layout = layout,
                   .params = params,
                   .chunks = chunk_ptrs,
                   .pipeline = pipeline,
                   .optimizer = optimizer,
                   .loader = loader,
                   .guard = guard,
                   .gerrymandering = gerrymandering,
                   .spikes = spikes,
                   .dp_batch_sum = dp_batch_sum,
                   .rowwise_dispatch = rowwise,
                   .rows = rows,
                   .train_data = train_fingerprint,
                   .step = resumed.step,
                   .tokens_seen = resumed.tokens_seen,
                   .start_tokens = resumed.tokens_seen,
                   .replay_origin = replay_origin,
                   .batch_size_history = start.batch_size_history,
                   .initial_lr = scheduled_initial_lr(config.optim.lr, start.batch_size_history),
                   .last_step = end_step};
  // Made up by the evaluator's start; with nothing to evaluate there is none to make up.
  ctx.eval_pending = resumed.eval_pending && in.evaluates();
  ctx.summary.start_step = ctx.step;
  for (const std::string& message : damaged_lines) progress.message(message);
  for (const std::string& message : start.messages) progress.message(message);
  if (start.checkpoint && resumed.recipe_revision < 2 && tc.precision == TrainPrecision::kMxfp8 &&
      mc.shared_expert_intermediate_size > 0)
    progress.message(fmt::format(
        "warning: {} was written while mxfp8 ran the shared expert in bf16; it now runs in MXFP8 "
        "as OLMo-core's recipe does, so the run continues close to, not on, its path",
        *start.checkpoint));
  announce(ctx, in, start, options, chunk_layers, communicator);
  if (!init_check_line.empty()) progress.message(init_check_line);
  if (finished) {
    // `make train` once more: the run's last checkpoint was made when it reached this step, and
    // its final evaluation and sample unless a stop signal skipped them (`moecore eval
    // --checkpoint DIR` evaluates it). Nothing is trained, logged or written again (no callback
    // is made: the metrics' would open a new TensorBoard file).
    progress.message(
        end_step < tc.max_steps && resumed.step < tc.max_steps
            ? fmt::format("done: nothing to train: {} (step {}, {} tokens seen) is at or past "
                          "{} (raise or remove it to go on towards the run's end at step {})",
                          *start.checkpoint, resumed.step, resumed.tokens_seen, hard_stop_text(tc),
                          tc.max_steps)
        : tc.max_tokens > 0
            ? fmt::format("done: nothing to train: {} has seen {} tokens, train.max_tokens={} "
                          "(raise it to continue the run)",
                          *start.checkpoint, resumed.tokens_seen, tc.max_tokens)
        : tc.max_epochs > 0
            ? fmt::format("done: nothing to train: {} has read train.max_epochs={} epoch(s) of "
                          "the training set (raise it to continue the run)",
                          *start.checkpoint, tc.max_epochs)
            : fmt::format(
                  "done: nothing to train: {} is at train.max_steps={} (raise it to continue the "
                  "run)",
                  *start.checkpoint, tc.max_steps));
    ctx.summary.steps = ctx.step;
    return ctx.summary;
  }
  // What the checkpoints say beyond the weights: the resumed checkpoint's, the --init-from
  // model's, or the run's own.
  const std::optional<std::string> metadata_source =
      start.checkpoint
          ? start.checkpoint
          : (options.init_from.empty() ? std::nullopt
                                       : std::optional<std::string>(options.init_from));
  const HfMetadata metadata = hf_metadata_of_run(
      tc.seq_len, mc.vocab_size, in.tokenizer ? &*in.tokenizer : nullptr, metadata_source);
  if (!metadata.note.empty()) progress.message(metadata.note);
  if (!options.init_from.empty() && !start.checkpoint)
    if (const std::string note = init_from_objective_note(mc, metadata.info, options.init_from);
        !note.empty())
      progress.message(note);
  add_callbacks(ctx, in, options, owner_pid, start.checkpoint.has_value(), metadata);

  StepBuffers buffers(tc.microbatches, rows / dp, mesh.dp.rank() * (rows / dp) * tc.seq_len);
  if (tc.cuda_graph) {
    ctx.step_graph =
        std::make_unique<StepGraph>(tc.device, tc.microbatches, buffers.local_rows, tc.seq_len,
                                    in.document_eos, document_masking_bos(config.data));
  }
  ctx.loop_start = std::chrono::steady_clock::now();
  for (auto& callback : ctx.callbacks) callback->on_start(ctx);
  // Rank 0 checks before each step's writes (metrics, checkpoints) and the final ones that the
  // run directory is still the one it locked; its error ends every rank (the job's abort).
  const auto check_run_dir = [&run_lock] {
    if (run_lock) run_lock->check_in_place();
  };
  // OLMo-core checks its batch size before each batch it loads: before the first update (a resume
  // that changed the batch's keys starts from train.batch_size, as OLMo-core's resume does), and
  // below after each update, before that step's callbacks, so that its checkpoint holds the batch
  // the next update reads and its evaluation knows whether the run goes on. A run in epochs asks
  // its loader once more at the last epoch's end (it is over when the loader says so), so a
  // decrease due there first reads the epoch's tail that batches of the old size left.
  const auto change_batch_size = [&] {
    if (ctx.step < ctx.last_step || ends_when_the_epoch_does(ctx))
      apply_batch_size_schedule(ctx, config, in.train_data, buffers);
  };
  change_batch_size();
  while (ctx.step < ctx.last_step) {
    StepReport report = run_step(ctx, grads, buffers);
    change_batch_size();
    check_run_dir();
    // Every rank's guard decided the same (read_decision), so every rank gives up at this step.
    if (tc.skip_max_consecutive > 0 && guard.consecutive_skips() >= tc.skip_max_consecutive)
      ctx.gave_up = fmt::format(
          "[train] steps {}-{} were all skipped (train.skip_max_consecutive={}; the last: {}): "
          "the weights have not changed since step {}{}",
          ctx.step - guard.consecutive_skips() + 1, ctx.step, tc.skip_max_consecutive,
          guard.last_skip_reason(), ctx.step - guard.consecutive_skips(),
          tc.checkpoint
              ? fmt::format("; saved at step {} (--resume with a higher "
                            "train.skip_max_consecutive, 0 for none, continues from there)",
                            ctx.step)
              : std::string());
    for (auto& callback : ctx.callbacks) callback->on_step_end(ctx, report);
    if (ctx.stopping()) {
      if (!ctx.stop_message.empty()) progress.message(ctx.stop_message);
      ctx.summary.stop_signal = ctx.stop_signal;
      break;
    }
  }
  if (ctx.step == ctx.last_step && ctx.last_step < tc.max_steps && !ctx.stopping())
    progress.message(fmt::format(
        "{} reached at step {}: stopping before the run's end at step {}, whose learning-rate "
        "schedule it followed{}",
        hard_stop_text(tc), ctx.step, tc.max_steps,
        tc.checkpoint ? " (--resume without it goes on)" : ""));
  check_run_dir();
  for (auto it = ctx.callbacks.rbegin(); it != ctx.callbacks.rend(); ++it) (*it)->on_end(ctx);
  if (ctx.step_graph) {
    const StepGraph& g = *ctx.step_graph;
    progress.message(fmt::format(
        "cuda_graph: {} steps replayed a captured graph, {} were captured, {} ran eagerly (the "
        "first, and each after an evaluation)",
        g.replays(), g.captures(), g.eager_steps()));
  }
  ctx.summary.steps = ctx.step;
  ctx.summary.skipped_steps = guard.skipped();
  // Only what this process measured: no loss where it trained no step, none for an evaluation
  // that did not run (a stop signal skips it; a run may have no validation data).
  const std::string trained = ctx.step > ctx.summary.start_step
                                  ? fmt::format("train loss {:.4f} -> {:.4f}",
                                                ctx.summary.first_loss, ctx.summary.last_loss)
                                  : std::string("no step trained");
  const std::string evaluated = ctx.summary.val_loss
                                    ? fmt::format("val loss {:.4f}", *ctx.summary.val_loss)
                                    : std::string("no final evaluation");
  progress.message(fmt::format("done: {} steps ({} skipped) in {:.0f}s; {}; {}; {}", ctx.step,
                               guard.skipped(), ctx.seconds(), trained, evaluated,
                               ctx.peak_memory));
  // After the final checkpoint, evaluation and sample: a run that stopped moving exits non-zero.
  MOE_CHECK(ctx.gave_up.empty(), "{}", ctx.gave_up);
  return ctx.summary;
}

}  // namespace moecore
