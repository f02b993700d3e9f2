#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "core/check.h"
#include "core/phase_timer.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "dist/alltoall_exchange.h"
#include "dist/communicator.h"
#include "dist/distributed_optimizer.h"
#include "dist/expert_layout.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "dist/pipeline_schedule.h"
#include "dist/rowwise_exchange.h"
#include "dist/traffic_counters.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/hf_weights_reader.h"
#include "io/metrics_sink.h"
#include "io/model_weights.h"
#include "io/run_dir_lock.h"
#include "kernels/gemm.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/gerrymandering.h"
#include "train/layout_validation.h"
#include "train/moe_metrics.h"
#include "train/pipeline_runner.h"
#include "train/profile_report.h"
#include "train/progress.h"
#include "train/resume_policy.h"
#include "train/round_trip_check.h"
#include "train/sample.h"
#include "train/step_guard.h"
#include "train/stop_signals.h"
#include "train/trainer_state.h"

namespace moecore {

namespace {

// Test hook for the "disk full during save" proof: MOECORE_FAULT_WRITE_BYTES=N makes file writes
// fail with ENOSPC after N more bytes, once the first checkpoint is on disk.
std::optional<int64_t> write_fault_from_env() {
  const char* value = std::getenv("MOECORE_FAULT_WRITE_BYTES");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::stoll(value);
}

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

// Per MoE layer, the routes of the last micro-batch that the rowwise dispatch dropped over all
// its routes, for the whole batch: the ranks of an ep group share one keep matrix, and ep_dp sums
// over the groups. Collective over ep_dp.
std::vector<double> drop_rates(const std::vector<dist::WindowRowwiseExchange::DropCount>& log,
                               const dist::Communicator& ep_dp) {
  std::vector<int64_t> counts;
  for (const auto& entry : log) {
    counts.push_back(entry.dropped);
    counts.push_back(entry.routes);
  }
  ep_dp.allreduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  std::vector<double> rates;
  for (size_t i = 0; i + 1 < counts.size(); i += 2)
    rates.push_back(counts[i + 1] > 0
                        ? static_cast<double>(counts[i]) / static_cast<double>(counts[i + 1])
                        : 0.0);
  return rates;
}

// out_dir/rank_stats/rank<r>.json: this rank's traffic per collective over the training loop and
// its peak resident memory at the loop's end (before the final checkpoint, evaluation and sample),
// what `moecore plan` predicts (bench/plan_validation.py compares them).
void write_rank_stats(const std::string& out_dir, int rank, int64_t stage, int64_t steps) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json traffic = nlohmann::json::object();
  for (const auto& [key, count] : dist::traffic_counters())
    traffic[key] = {{"bytes", count.bytes}, {"calls", count.calls}};
  const nlohmann::json stats = {{"rank", rank},
                                {"stage", stage},
                                {"steps", steps},
                                {"peak_rss_kib", static_cast<int64_t>(usage.ru_maxrss)},
                                {"traffic", traffic}};
  std::error_code ec;
  std::filesystem::create_directories(out_dir + "/rank_stats", ec);
  MOE_CHECK(!ec, "[train] cannot create {}/rank_stats: {}", out_dir, ec.message());
  // A plain write: a diagnostics file, outside the checkpoints' atomic writes and the write-fault
  // test hook (which must fire on a checkpoint).
  const std::string path = fmt::format("{}/rank_stats/rank{}.json", out_dir, rank);
  std::ofstream out(path, std::ios::trunc);
  out << stats.dump(1) << '\n';
  out.close();
  MOE_CHECK(out.good(), "[train] cannot write {}", path);
}

}  // namespace

TrainSummary train(const RunConfig& config_in, const TrainOptions& options) {
  // The effective config, saved with the run: it may gain the EOS id that document masking
  // resolved from the token files' meta.json, so that a checkpoint evaluates alone.
  RunConfig config = config_in;
  const TrainConfig& tc = config.train;
  const ModelConfig& mc = config.model;
  const std::unique_ptr<dist::Communicator> world_group = dist::mpi_world();
  const dist::Communicator& world = *world_group;
  const ParallelConfig& pc = config.parallel;
  // The layout checks `moecore plan` shares, before any group or buffer is built.
  (void)validate_layout(config, world.size());
  const dist::Mesh mesh = dist::Mesh::build(world, pc.ep, pc.pp);
  const bool rank0 = world.rank() == 0;
  const int64_t dp = mesh.dp.size(), pp = pc.pp;
  // Pipeline: the model chunks this rank runs (one, the whole model, without pipelining).
  const int64_t virtual_stages = resolve_virtual_stages(pc);
  const std::vector<int64_t> chunk_layers =
      dist::split_layers(mc.num_hidden_layers, pp * virtual_stages, pc.stage_layers);
  const std::vector<LayerRange> my_chunks = dist::stage_chunks(chunk_layers, pp, mesh.stage());
  set_threads(tc.threads, world.size());
  const kernels::MatmulPrecisionScope matmul_precision(tc.precision);
  const int64_t global_rows = tc.batch_size / tc.microbatches;
  MOE_CHECK(
      global_rows % dp == 0,
      "[parallel] train.batch_size / train.microbatches = {} sequences per micro-batch do not "
      "split over dp={} ranks",
      global_rows, dp);

  // Every input is opened and checked before anything is written.
  MOE_CHECK(!config.data.train.empty(), "[train] data.train lists no token files");
  const data::TokenDataset train_data =
      data::TokenDataset::open(config.data.train, tc.seq_len, mc.vocab_size, config.data.dtype);
  std::optional<data::TokenDataset> val_data;
  if (!config.data.val.empty())
    val_data =
        data::TokenDataset::open(config.data.val, tc.seq_len, mc.vocab_size, config.data.dtype);
  // Training and validation documents end at the same EOS.
  const int32_t document_eos = document_masking_eos(config.data, train_data);
  MOE_CHECK(document_eos < 0 || !val_data || val_data->metadata_eos_id() < 0 ||
                val_data->metadata_eos_id() == document_eos,
            "[data] data.document_masking: documents end at EOS {} in training but the validation "
            "files' meta.json says eos_id={}",
            document_eos, val_data ? val_data->metadata_eos_id() : -1);
  if (document_eos >= 0) config.data.eos_id = document_eos;
  std::optional<data::Tokenizer> tokenizer;
  if (!config.data.tokenizer.empty()) {
    tokenizer = data::Tokenizer::load(config.data.tokenizer);
    MOE_CHECK(tokenizer->vocab_size() <= mc.vocab_size,
              "[train] tokenizer {} has {} tokens but model.vocab_size={}", config.data.tokenizer,
              tokenizer->vocab_size(), mc.vocab_size);
  }
  // The whole model (checkpoints, generation) and the part this rank holds (its stage's layers,
  // its experts).
  const ParamLayout full_layout = ParamLayout::build(mc);
  const int64_t ep = pc.ep;
  const ParamLayout layout = ParamLayout::build(mc, ep, mesh.ep.rank(), my_chunks);
  if (!options.init_from.empty()) io::check_hf_weights(full_layout, options.init_from);
  // Rank 0 writes the run directory and holds its lock until the run ends (the kernel drops it if
  // the process dies); the lock comes before anything in the directory is touched, so a second
  // trainer started at the same instant is refused before it can delete or write anything.
  std::optional<io::RunDirLock> run_lock;
  int64_t owner_pid = ::getpid();  // rank 0's: the staging directories' names
  if (rank0) {
    std::error_code ec;
    std::filesystem::create_directories(tc.out_dir, ec);
    MOE_CHECK(!ec, "[train] cannot create output directory '{}': {}", tc.out_dir, ec.message());
    run_lock.emplace(io::RunDirLock::acquire(tc.out_dir));
    remove_interrupted_saves(tc.out_dir);
  }
  world.broadcast(&owner_pid, sizeof(owner_pid), 0);
  world.barrier();  // the other ranks read the run directory only once rank 0 has tidied it
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
  MOE_CHECK(options.init_from.empty() || !checkpoint,
            "[train] --init-from {} with --resume: {} already holds checkpoint {}; resume it "
            "without --init-from",
            options.init_from, tc.out_dir, checkpoint.value_or(""));
  // Resume policy: the checkpoint replays exactly only under the configuration that wrote it.
  std::optional<RunConfig> saved_config;
  std::vector<std::string> change_messages;
  bool config_changed = false;
  if (checkpoint) {
    saved_config = load_run_config(*checkpoint + "/config.toml");
    const std::vector<ConfigChange> changes = replay_config_changes(*saved_config, config);
    std::string listed;
    for (const ConfigChange& change : changes)
      listed += (listed.empty() ? "" : "; ") + describe(change);
    MOE_CHECK(changes.empty() || options.allow_config_change,
              "[train] --resume: {} was written with another configuration ({}), so the run would "
              "not replay exactly; pass --allow-config-change to continue with the new values",
              *checkpoint, listed);
    for (const ConfigChange& change : changes)
      change_messages.push_back("config change on resume: " + describe(change));
    if (const std::string note = horizon_note(*saved_config, config); !note.empty())
      change_messages.push_back(note);
    config_changed = !changes.empty();
  }
  // A run killed between committing a checkpoint and pruning the old ones left one too many.
  if (checkpoint && rank0) prune_checkpoints(tc.out_dir, *checkpoint, tc.keep_last);
  if (checkpoint) world.barrier();  // no rank looks at the run directory while rank 0 prunes

  ParamBuffers params(layout), grads(layout);
  init_params(layout, tc.seed, params);  // per-name streams: the same weights in any layout
  // Expert-parallel dispatch. With ep = 1 every expert is local and nothing moves, so `rowwise`
  // is the plain dropless local path there (parallel.capacity_factor only applies to ep > 1).
  const dist::AllToAllExchange sync_exchange(mesh.ep);
  std::optional<dist::WindowRowwiseExchange> rowwise_exchange;
  if (ep > 1 && config.parallel.dispatch == Dispatch::kRowwise)
    rowwise_exchange.emplace(mesh.ep, mesh.dp, pc.capacity_factor);  // windows on the stage
  const ExpertExchange* exchange = nullptr;
  if (rowwise_exchange)
    exchange = &*rowwise_exchange;
  else if (ep > 1)
    exchange = &sync_exchange;
  // Batch statistics of the global batch: summed over this stage's data-parallel ranks.
  const Transformer::BatchSum dp_batch_sum =
      dp > 1 ? Transformer::BatchSum(
                   [&mesh](double* values, int64_t count) { mesh.dp.allreduce_sum(values, count); })
             : Transformer::BatchSum();
  std::vector<std::unique_ptr<Transformer>> chunks;
  std::vector<Transformer*> chunk_ptrs;
  for (const LayerRange& range : my_chunks) {
    chunks.push_back(std::make_unique<Transformer>(mc, layout, exchange, range));
    chunk_ptrs.push_back(chunks.back().get());
    chunks.back()->set_batch_sum(dp_batch_sum);
    chunks.back()->set_document_masking(document_eos);
  }
  PipelineRunner pipeline(mesh, chunk_ptrs, pc.schedule, tc.microbatches);
  // The whole model: a resumed checkpoint is read into it, and the final sample runs on it.
  ParamBuffers full_params(full_layout);
  dist::DistributedOptimizer optimizer(layout, config.optim, mesh, config.parallel.zero == 1);
  MOE_CHECK(!config.parallel.overlap_grad_reduce || config.parallel.zero == 0,
            "[parallel] parallel.overlap_grad_reduce needs parallel.zero=0 (ZeRO-1 reduce-scatters "
            "the whole gradient after the backward)");
  StepGuard guard({tc.skip_sigma, tc.skip_window, tc.skip_min_window});
  GerrymanderingDetector gerrymandering({tc.gerrymander_window, tc.gerrymander_threshold});
  int64_t step = 0, tokens_seen = 0;
  uint64_t cursor = 0;
  ReplayOrigin replay_origin;
  if (checkpoint) {
    AdamW full_state(full_layout, config.optim), local_state(layout, config.optim);
    // The weights and moments; the trainer state, checked field by field against the config that
    // wrote it, is read below as a struct.
    load_checkpoint(*checkpoint, mc, full_layout, full_params, &full_state);
    dist::take_local(full_layout, full_params, layout, params);
    dist::take_local(full_layout, full_state.exp_avg(), layout, local_state.exp_avg());
    dist::take_local(full_layout, full_state.exp_avg_sq(), layout, local_state.exp_avg_sq());
    local_state.set_steps_taken(full_state.steps_taken());
    optimizer.import_state(local_state);
    const TrainerState resumed = load_trainer_state(*checkpoint, saved_config->train);
    step = resumed.step;
    MOE_CHECK(full_state.steps_taken() <= step,
              "[checkpoint] {}: the optimizer's steps_taken={} exceeds the trainer state's step={}",
              *checkpoint, full_state.steps_taken(), step);
    tokens_seen = resumed.tokens_seen;
    cursor = resumed.data_cursor;
    // An allowed change of batch size or sequence length changes how the cursor and the token
    // count grow from here on: later checkpoints count from this point.
    replay_origin = config_changed ? ReplayOrigin{step, cursor, tokens_seen} : resumed.origin;
    guard.from_json(resumed.step_guard);
    gerrymandering.from_json(resumed.gerrymandering);
  } else if (!options.init_from.empty()) {
    // Every rank reads the whole model (it keeps the whole-model copy anyway) and keeps its part,
    // so any layout starts from the single process's weights.
    io::read_hf_weights(full_layout, options.init_from, full_params);
    dist::take_local(full_layout, full_params, layout, params);
  }
  // The config.json of every checkpoint of the run.
  const nlohmann::json hf_config = io::hf_config_json(
      mc, tc.seq_len, tokenizer ? std::optional<int32_t>(tokenizer->eos_id()) : std::nullopt);
  // Before the first step and before anything but the lock is in out_dir: the imported weights
  // written as this run's checkpoints will be (fp32 weights, config.json, config.toml) and read
  // back give the same logits (train/round_trip_check.h). Rank 0 checks the whole model, which
  // every rank holds and takes its part of.
  std::string init_check_line;
  if (!options.init_from.empty()) {  // never with a checkpoint, refused above
    const RoundTripCheck init_check =
        round_trip_check_on_rank0(world, tc.out_dir + "/.init-from-check", full_layout, full_params,
                                  {&config, hf_config, {}, {}}, "[init-from]");
    init_check_line = fmt::format(
        "init-from self-check: {} written in moecore's format and read back gives the same logits "
        "bit for bit ({} x {} tokens, max |diff| {:.3g}, max |logit| {:.4g}; {:.1f} s)",
        options.init_from, init_check.batch, init_check.seq, init_check.max_abs_diff,
        init_check.max_abs_logit, init_check.seconds);
  }
  // Written only once the inputs and the checkpoint are known to fit this config.
  if (rank0)
    io::write_text_atomic(tc.out_dir + "/config.toml", run_config_to_toml(config), "[train]");
  // Every rank reads the same global batches in the same order and keeps its slice, so the data
  // cursor, and with it every checkpoint, does not depend on the layout.
  data::DataLoader loader(train_data, tc.seed, cursor);
  std::optional<io::MetricsSink> metrics;
  if (rank0) metrics.emplace(tc.out_dir, step);
  const std::optional<int64_t> write_fault = write_fault_from_env();
  const std::string tokenizer_json = tokenizer ? tokenizer->to_json() : std::string();

  Progress progress(tc.max_steps, tc.log_every, rank0);
  for (const std::string& reason : damaged)
    progress.message(fmt::format("warning: skipped damaged checkpoint {}", reason));
  for (const std::string& change : change_messages) progress.message(change);
  progress.message(fmt::format(
      "moecore train: {:.2f}M parameters ({:.2f}M dense, {:.2f}M expert), {} threads, {} GEMMs, "
      "{} train instances of {} tokens{}{}",
      static_cast<double>(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert)) /
          1e6,
      static_cast<double>(layout.numel(ParamGroup::kDense)) / 1e6,
      static_cast<double>(layout.numel(ParamGroup::kExpert)) / 1e6, omp_get_max_threads(),
      tc.precision == kernels::MatmulPrecision::kFp32               ? "fp32"
      : kernels::bf16_gemm_path() == kernels::Bf16GemmPath::kNative ? "bf16"
                                                                    : "bf16 (emulated)",
      train_data.num_instances(), tc.seq_len,
      document_eos >= 0 ? fmt::format(", document masking (EOS {})", document_eos) : "",
      checkpoint                  ? fmt::format(", resumed from {} (step {})", *checkpoint, step)
      : options.init_from.empty() ? ""
                                  : fmt::format(", initialised from {}", options.init_from)));
  if (!init_check_line.empty()) progress.message(init_check_line);
  if (world.size() > 1)
    progress.message(fmt::format(
        "parallel: {} ranks, dp={} ep={} zero={}; optimizer state {:.2f} MiB per rank{}",
        world.size(), dp, config.parallel.ep, config.parallel.zero,
        static_cast<double>(optimizer.state_floats()) * 4.0 / (1 << 20),
        rowwise_exchange
            ? fmt::format("; rowwise dispatch, capacity_factor {}", config.parallel.capacity_factor)
            : std::string()));
  if (pp > 1) {
    std::string split;
    for (int64_t n : chunk_layers) split += (split.empty() ? "" : ", ") + std::to_string(n);
    progress.message(fmt::format(
        "pipeline: pp={} schedule={} virtual_stages={} microbatches={}; layers per chunk [{}]", pp,
        pc.schedule == PipelineSchedule::kOneFOneB      ? "1f1b"
        : pc.schedule == PipelineSchedule::kInterleaved ? "interleaved-1f1b"
                                                        : "gpipe",
        virtual_stages, tc.microbatches, split));
  }

  const int64_t rows = global_rows;             // sequences per micro-batch, all ranks together
  const int64_t local_rows = global_rows / dp;  // this rank's slice
  const int64_t slice_begin = mesh.dp.rank() * local_rows * tc.seq_len;
  const float micro_scale = 1.0f / static_cast<float>(tc.microbatches);
  const int64_t eval_instances = tc.eval_batches * rows;
  std::string last_checkpoint_dir;  // rank 0
  auto save = [&](int64_t at_step) {
    // Collective: every rank writes its part (see DistributedOptimizer::checkpoint_state).
    nlohmann::json state = {{"step", at_step},
                            {"tokens_seen", tokens_seen},
                            {"data_cursor", loader.cursor()},
                            {"seed", tc.seed},
                            {"rng", {{"kind", "counter-based data order"}, {"seed", tc.seed}}},
                            {"lr_next", learning_rate(config.optim, at_step, tc.max_steps)},
                            {"step_guard", guard.to_json()},
                            {"gerrymandering", gerrymandering.to_json()}};
    if (replay_origin != ReplayOrigin{})
      state["replay_origin"] = {{"step", replay_origin.step},
                                {"data_cursor", replay_origin.data_cursor},
                                {"tokens_seen", replay_origin.tokens_seen}};
    const CheckpointContents contents{&config, &full_layout, nullptr,       nullptr,
                                      state,   hf_config,    tokenizer_json};
    const std::string staging = checkpoint_staging_dir(tc.out_dir, at_step, owner_pid);
    if (rank0) begin_checkpoint(tc.out_dir, at_step, owner_pid);
    world.barrier();
    try {
      write_checkpoint_part(staging,
                            {world.rank(), world.size(), &params, optimizer.checkpoint_weights(),
                             optimizer.checkpoint_state(), optimizer.steps_taken()});
    } catch (...) {
      // Alone, tidy up now; with other ranks still writing, the job ends and the next start
      // removes the staging directory (remove_interrupted_saves).
      if (world.size() == 1) discard_checkpoint(staging);
      throw;
    }
    world.barrier();
    if (!rank0) return;
    const std::string dir =
        commit_checkpoint(tc.out_dir, at_step, staging, contents, world.size(), tc.keep_last);
    last_checkpoint_dir = dir;
    progress.message(fmt::format("checkpoint {}", dir));
    if (write_fault) io::set_write_failure_for_testing(*write_fault);
  };
  auto run_eval = [&](int64_t at_step) -> double {
    // Without expert parallelism the ranks at dp position 0 evaluate (rank 0 alone, or one rank
    // per pipeline stage), with the data-parallel reduction off, and the others go on to the next
    // step's first collective and wait there. With it, the experts are spread over the ranks:
    // every rank evaluates the same batches together.
    if (!val_data || (mesh.dp.rank() != 0 && ep == 1)) return 0.0;
    for (Transformer* chunk : chunk_ptrs) {
      chunk->set_batch_sum(nullptr);
      chunk->set_routing_seed(routing_forward_seed(tc.seed, at_step, -1));  // all tokens
      chunk->set_routing_token_offset(0);
    }
    EvalResult r = evaluate(
        [&](const int32_t* tokens, const int32_t* targets, int64_t batch_rows, int64_t seq) {
          return pipeline.forward_only(params, tokens, targets, batch_rows, seq);
        },
        *val_data, rows, eval_instances);
    if (pp > 1) {  // the last stage saw the loss
      double result[4] = {r.loss, r.perplexity, static_cast<double>(r.tokens),
                          static_cast<double>(r.instances)};
      mesh.pp.broadcast(result, sizeof(result), static_cast<int>(pp - 1));
      r = {result[0], result[1], static_cast<int64_t>(result[2]), static_cast<int64_t>(result[3])};
    }
    for (Transformer* chunk : chunk_ptrs) chunk->set_batch_sum(dp_batch_sum);
    if (!rank0) return r.loss;
    metrics->log(at_step, {{"val/loss", r.loss}, {"val/ppl", r.perplexity}});
    progress.message(fmt::format("eval  step {:>6}  val_loss {:.4f}  val_ppl {:.2f}  ({} tokens)",
                                 at_step, r.loss, r.perplexity, r.tokens));
    return r.loss;
  };

  TrainSummary summary;
  summary.start_step = step;
  std::vector<std::vector<int32_t>> step_tokens(static_cast<size_t>(tc.microbatches)),
      step_targets(static_cast<size_t>(tc.microbatches));
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t last_saved = checkpoint ? step : -1;
  const StopSignals stop_signals;  // SIGTERM / SIGINT / SIGUSR1: save and stop after the step
  // train.profile: phases timed from the end of the first step (allocation, first touch) on.
  phase_timer::set_enabled(tc.profile);
  double profile_start = 0.0;
  dist::reset_traffic_counters();  // what the steps move, for out_dir/rank_stats
  const int64_t steps_before = step;
  while (step < tc.max_steps) {
    grads.zero();
    for (Transformer* chunk : chunk_ptrs) chunk->clear_selection_counts();  // evaluations counted
    // Every rank reads the step's micro-batches (the data cursor stays layout-free) and keeps its
    // slice; the pipeline runs them through this rank's chunks in its schedule's order.
    std::vector<PipelineRunner::MicroBatch> micro_batches;
    for (int64_t micro = 0; micro < tc.microbatches; ++micro) {
      loader.next_batch(rows, step_tokens[static_cast<size_t>(micro)],
                        step_targets[static_cast<size_t>(micro)]);
      micro_batches.push_back({step_tokens[static_cast<size_t>(micro)].data() + slice_begin,
                               step_targets[static_cast<size_t>(micro)].data() + slice_begin});
    }
    std::vector<dist::WindowRowwiseExchange::DropCount> last_drops;  // the last micro-batch's
    auto pass_hook = [&](Transformer& chunk, bool forward, int64_t micro, bool done) {
      const bool last_micro = micro + 1 == tc.microbatches;
      if (forward && !done) {
        chunk.set_routing_seed(routing_forward_seed(tc.seed, step, micro));  // model.routing
        chunk.set_routing_token_offset(slice_begin);
        if (rowwise_exchange) rowwise_exchange->clear_drop_log();
      } else if (forward && last_micro && rowwise_exchange) {
        // Chunks run the last micro-batch in layer order.
        const auto& log = rowwise_exchange->drop_log();
        last_drops.insert(last_drops.end(), log.begin(), log.end());
      } else if (!forward && !done) {
        // Overlap: during the last micro-batch's backward, each layer's gradients start their
        // all-reduce as soon as they are final.
        const bool overlap = pc.overlap_grad_reduce && dp > 1 && last_micro;
        chunk.set_layer_grads_ready(overlap ? Transformer::LayerGradsReady([&](int64_t layer) {
          optimizer.start_layer_reduce(grads, layer);
        })
                                            : Transformer::LayerGradsReady());
      }
    };
    LossParts loss = pipeline.train_step(params, grads, micro_batches, local_rows, tc.seq_len,
                                         micro_scale, pass_hook);
    if (pp > 1) {
      // Each stage holds its layers' share of the loss: the sum is the model's, on every rank.
      double parts[4] = {loss.ce, loss.lb, loss.z, loss.total};
      mesh.pp.allreduce_sum(parts, 4);
      loss.ce = parts[0];
      loss.lb = parts[1];
      loss.z = parts[2];
      loss.total = parts[3];
    }
    const double lr = learning_rate(config.optim, step, tc.max_steps);
    // Losses and the norm are global (identical on every rank), so every rank takes the same
    // decision.
    const double norm = optimizer.reduce_gradients(grads);
    const std::string skip_reason = guard.check(loss.total, norm);
    if (skip_reason.empty()) {
      optimizer.step(params, grads, lr, norm);
      // Auxiliary-loss-free balancing: each chunk's tally is already the global batch's (summed
      // over dp with the batch statistics), so every rank applies the same update to its copy.
      for (Transformer* chunk : chunk_ptrs) chunk->update_router_bias(params);
    } else {
      progress.message(
          fmt::format("warning: step {} skipped ({}); weights unchanged", step + 1, skip_reason));
    }
    ++step;
    tokens_seen += tc.batch_size * tc.seq_len;

    // Diagnostics of the last micro-batch.
    const std::vector<const Transformer*> const_chunks(chunk_ptrs.begin(), chunk_ptrs.end());
    MoeMetrics moe =
        compute_moe_metrics(const_chunks, rowwise_exchange ? drop_rates(last_drops, mesh.ep_dp)
                                                           : std::vector<double>());
    if (pp > 1)  // every stage's layers reach rank 0's logs
      moe = combine_stage_metrics(moe, mc, [&mesh](double* values, int64_t count) {
        mesh.pp.allreduce_sum(values, count);
      });
    // Pipeline bubble: the mean over the stages of the time spent waiting for a neighbour.
    double bubble =
        pipeline.step_seconds() > 0.0 ? pipeline.idle_seconds() / pipeline.step_seconds() : 0.0;
    if (pp > 1) {
      mesh.pp.allreduce_sum(&bubble, 1);
      bubble /= static_cast<double>(pp);
    }
    const GerrymanderingDetector::Verdict verdict =
        gerrymandering.observe(loss.lb, moe.mean_load_imbalance);
    if (verdict.newly_flagged)
      progress.message(fmt::format(
          "warning: token gerrymandering at step {}: load-balancing loss trend {:+.1f}% while load "
          "imbalance trend {:+.1f}% over the last {} steps",
          step, 100.0 * verdict.lb_trend, 100.0 * verdict.imbalance_trend, tc.gerrymander_window));

    const double seconds = elapsed();
    if (tc.profile && step == summary.start_step + 1) {
      phase_timer::reset();
      profile_start = seconds;
    }
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
    if (pp > 1) {
      scalars.emplace_back("pipeline/bubble", bubble);
      scalars.emplace_back("pipeline/peak_live_microbatches",
                           static_cast<double>(pipeline.peak_live()));
    }
    const bool log_step = step % tc.log_every == 0 || step == tc.max_steps;
    for (auto& scalar : moe.scalars(log_step)) scalars.push_back(std::move(scalar));
    if (rank0) metrics->log(step, scalars);
    if (step == summary.start_step + 1) summary.first_loss = loss.ce;
    summary.last_loss = loss.ce;
    progress.update(step, loss.ce, tokens_per_s,
                    seconds / static_cast<double>(step - summary.start_step),
                    fmt::format("lb {:.3f}  imb {:.2f}  gnorm {:.2f}  lr {:.1e}", loss.lb,
                                moe.mean_load_imbalance, norm, lr));

    // Every rank must stop at the same step (the others would wait in the next collective): the
    // ranks' clocks differ a little, and a signal may reach only some ranks, so the first rank to
    // run out of time or to get a stop signal stops them all.
    double stop_votes[2] = {tc.max_seconds > 0.0 && seconds >= tc.max_seconds ? 1.0 : 0.0,
                            static_cast<double>(stop_signals.received())};
    if (world.size() > 1) world.allreduce_max(stop_votes, 2);
    const bool out_of_time = stop_votes[0] > 0.0;
    const int stop_signal = static_cast<int>(stop_votes[1]);
    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step < tc.max_steps && !out_of_time &&
        stop_signal == 0)
      run_eval(step);
    if (tc.save_every > 0 && step % tc.save_every == 0) {
      save(step);
      last_saved = step;
    }
    if (stop_signal != 0) {
      progress.message(
          fmt::format("{} received: stopping at step {} with a checkpoint (resume "
                      "with --resume)",
                      stop_signal_name(stop_signal), step));
      summary.stop_signal = stop_signal;
      break;
    }
    if (out_of_time) {
      progress.message(
          fmt::format("train.max_seconds={} reached at step {}: stopping (resume "
                      "with --resume)",
                      tc.max_seconds, step));
      break;
    }
  }
  write_rank_stats(tc.out_dir, world.rank(), mesh.stage(), step - steps_before);
  if (tc.profile && rank0) {
    phase_timer::set_enabled(false);
    const int64_t profiled = step - summary.start_step - 1;
    io::write_text_atomic(tc.out_dir + "/profile.json",
                          profile_report_json(profiled, elapsed() - profile_start), "[train]");
    progress.message(profile_report_line(profiled, elapsed() - profile_start));
  }
  if (last_saved != step) save(step);
  summary.steps = step;
  summary.skipped_steps = guard.skipped();
  // Stopped by a signal: the checkpoint is all that matters (a preemption's grace period is short),
  // so no final evaluation and no sample.
  if (summary.stop_signal == 0) summary.val_loss = run_eval(step);
  if (rank0) metrics->close();
  // Peak resident memory (getrusage's high-water mark, KiB on Linux) of the training itself, the
  // largest rank of each pipeline stage.
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  double peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  mesh.dp.allreduce_max(&peak_mib, 1);
  std::vector<int64_t> stage_peak_kib(static_cast<size_t>(pp));
  const int64_t my_peak_kib = static_cast<int64_t>(peak_mib * 1024.0);
  mesh.pp.allgather(&my_peak_kib, stage_peak_kib.data(), 1);
  world.allreduce_max(&peak_mib, 1);
  if (rank0 && tokenizer && tc.sample_tokens > 0 && summary.stop_signal == 0) {
    // The run is complete and saved; the sample runs on the whole model read back from the final
    // checkpoint (whatever the layout), and a model that cannot be sampled (e.g. non-finite
    // weights after a diverged run) only loses its sample.
    try {
      io::load_weights_from_dir(full_layout, last_checkpoint_dir, full_params);
      const std::string sample = generate_sample(mc, full_layout, full_params, *tokenizer,
                                                 tc.sample_prompt, tc.sample_tokens, tc.seed);
      progress.message(fmt::format("sample: {}{}", tc.sample_prompt, sample));
    } catch (const Error& e) {
      progress.message(fmt::format("warning: no sample: {}", e.what()));
    }
  }
  std::string per_stage;
  if (pp > 1) {
    for (int64_t kib : stage_peak_kib)
      per_stage +=
          fmt::format("{}{:.1f}", per_stage.empty() ? "" : ", ", static_cast<double>(kib) / 1024.0);
    per_stage = fmt::format("; per stage [{}] MiB", per_stage);
  }
  progress.message(
      fmt::format("done: {} steps ({} skipped) in {:.0f}s; train loss {:.4f} -> {:.4f}; "
                  "val loss {:.4f}; peak RSS {:.1f} MiB per rank (max over {} ranks){}",
                  step, guard.skipped(), elapsed(), summary.first_loss, summary.last_loss,
                  summary.val_loss, peak_mib, world.size(), per_stage));
  return summary;
}

}  // namespace moecore
