#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "dist/block_exchange_steps.h"
#include "dist/pipeline_schedule.h"
#include "model/bf16_weight_copies.h"
#include "model/mx_weight_caches.h"
#include "model/params.h"
#include "plan/step_shapes.h"
#include "plan/units.h"

namespace moecore::plan {

namespace {

// Receives posted ahead by the pipeline runner (kLookahead = 2, plus the one being consumed) and
// one send still in flight, each one hidden state of a micro-batch.
constexpr double kPipelineBuffers = 4.0;

// The peak: the parts together, the workspace and Open MPI's scratch (what the reduction takes
// from the heap beside the workspace) alive at once; on an accelerator without the host-side
// buffers (the token ids), which are then `host`.
void add_up_peak(RankMemory& m, bool device) {
  const double host_side = m.batch_tokens;
  m.peak = m.weights + m.gradients + m.optimizer_state + m.bf16_weight_copies + m.mx_weight_caches +
           m.lent_expert_inputs + m.operand_copies + m.activations + m.recompute_buffers +
           m.merge_sums + m.workspace + m.mpi_scratch + m.dispatch_buffers + m.pipeline_buffers +
           m.runtime + (device ? 0.0 : host_side + m.downstream_logits);
  m.host = device ? host_side + m.downstream_logits : 0.0;
}

// Every chunk (Transformer) keeps a workspace (core/workspace.h) for the whole run, of its
// passes' largest scratch; ZeRO-1's reduction buffers borrow the first chunk's, which grows to
// the larger of the two. Open MPI's copies come on top (add_up_peak).
double workspace_bytes(const RankMemory& m, double first_chunk_scratch) {
  return m.pass_scratch - first_chunk_scratch + std::max(first_chunk_scratch, m.optimizer_scratch);
}

// Buffers that keep the largest size they were given, one per slot: `counts[i]` slots of
// `sizes[i]` bytes in shape i; slot k as large as the largest of the shapes with more than k.
double slot_by_slot(const std::vector<int64_t>& counts, const std::vector<double>& sizes) {
  const int64_t slots = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  double bytes = 0.0;
  for (int64_t k = 0; k < slots; ++k) {
    double largest = 0.0;
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i] > k) largest = std::max(largest, sizes[i]);
    bytes += largest;
  }
  return bytes;
}

// The model merger's sums (train/callbacks/model_merger.h): one per merge window open at once,
// each of the tensors a rank writes in its checkpoint part (those whose first element lies in its
// equal slice of its group, dp ranks for dense tensors and ep_dp for experts): the stage's
// largest rank's.
double merge_sum_bytes(const TrainConfig& tc, const ParamLayout& local, int64_t dp, int64_t ep_dp,
                       bool evaluated) {
  const std::vector<int64_t> steps = merge_steps(tc, tc.max_steps);
  // Sums alive at once: a window's from its first update's add to its last update's write, which
  // frees it before a window that starts at that update takes its own (the merger visits windows
  // by their last update). At window i's first update, the windows alive are those that end after
  // it and began by it: merge steps in (steps[i] - n + 1, steps[i]], or itself alone (n = 1).
  int64_t open = 0;
  for (size_t i = 0, j = 0; i < steps.size(); ++i) {
    while (j < i && steps[j] < steps[i] - tc.merge_last_n_steps + 2) ++j;
    open = std::max<int64_t>(open, static_cast<int64_t>(i - j + 1));
  }
  if (open == 0) return 0.0;
  // A run that evaluates the averages sums its whole local model (train/callbacks/model_merger.h).
  if (evaluated)
    return static_cast<double>(open) * kF *
           static_cast<double>(local.numel(ParamGroup::kDense) + local.numel(ParamGroup::kExpert));
  double largest = 0.0;
  for (const auto& [group, ranks] :
       {std::pair{ParamGroup::kDense, dp}, {ParamGroup::kExpert, ep_dp}}) {
    const size_t numel = local.numel(group);
    if (numel == 0) continue;
    const auto r = static_cast<size_t>(ranks);
    const size_t shard = (numel + r - 1) / r;
    std::vector<double> per_rank(r, 0.0);
    for (const ParamSpec& spec : local.specs())
      if (spec.group == group) per_rank[spec.offset / shard] += static_cast<double>(spec.numel);
    largest += *std::max_element(per_rank.begin(), per_rank.end());
  }
  return static_cast<double>(open) * kF * largest;
}

}  // namespace

RankMemory rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                       double runtime_bytes, bool device, const ParamLayout& local) {
  const ModelConfig& mc = config.model;
  const ParallelConfig& pc = config.parallel;
  const TrainConfig& tc = config.train;
  RankMemory m;
  m.stage = stage;
  const std::vector<LayerRange> ranges = dist::stage_chunks(layout.chunk_layers, layout.pp, stage);
  m.dense_params = static_cast<int64_t>(local.numel(ParamGroup::kDense));
  m.expert_params = static_cast<int64_t>(local.numel(ParamGroup::kExpert));
  const double local_floats = static_cast<double>(m.dense_params + m.expert_params);
  m.weights = kF * local_floats;
  m.gradients = kF * local_floats;
  // The bf16 copies of the GEMM weights each chunk's modules multiply in bf16 (2 bytes each).
  const PrecisionRecipe recipe = PrecisionRecipe::from_train(tc.precision, tc.mxfp8);
  for (const LayerRange& range : ranges)
    for (const ParamRange& copy : bf16_copy_ranges(mc, local, range, recipe))
      m.bf16_weight_copies += 2.0 * static_cast<double>(copy.numel);
  for (const LayerRange& range : ranges)
    for (const MxWeightRange& cache : mx_weight_ranges(mc, local, range, recipe))
      m.mx_weight_caches += static_cast<double>(mx_cache_bytes(cache));

  // DistributedOptimizer: a replica of both moments, or per group a 1/ranks slice of them plus a
  // padded gradient shard; its step pads the gradient for the reduce-scatter and gathers the
  // weights through a send shard and a ranks x shard buffer, one group at a time.
  // Open MPI's temporaries, measured with bench/plan_validation.py (Open MPI 4.1): a non-blocking
  // all-reduce holds a copy of its whole payload until it completes, and the dense and expert
  // all-reduces are in flight together; MPI_Reduce_scatter_block reduces along a binomial tree
  // whose root (the group's rank 0) holds one copy of the whole send buffer per tree level during
  // the call, floor(log2 ranks) of them (measured: 1 copy at 2 and 3 ranks, 2 at 4, 3 at 8; the
  // other ranks hold fewer, down to none), on top of the padded one: the plan gives the root's,
  // the stage's largest. On an accelerator (NCCL, no such tree of copies) one copy is kept as an
  // allowance, as before. Groups of one rank call no MPI.
  const std::pair<int64_t, int64_t> groups[] = {{m.dense_params, layout.dp},
                                                {m.expert_params, layout.ep_dp}};
  if (pc.zero == 0) {
    m.optimizer_state = 2.0 * kF * local_floats;
    for (const auto& [numel, ranks] : groups)
      if (ranks > 1) m.mpi_scratch += kF * static_cast<double>(numel);
    m.reduction_peak = m.mpi_scratch;
  } else {
    for (const auto& [numel, ranks] : groups) {
      const int64_t shard = (numel + ranks - 1) / ranks;
      const int64_t slice = std::min(numel, shard);  // rank 0's, the largest
      const double padded = kF * static_cast<double>(shard) * static_cast<double>(ranks);
      const double gather = kF * static_cast<double>(shard) * static_cast<double>(ranks + 1);
      const double levels = device ? 1.0 : std::floor(std::log2(static_cast<double>(ranks)));
      const double mpi = ranks > 1 ? padded * levels : 0.0;
      m.optimizer_state += kF * (2.0 * static_cast<double>(slice) + static_cast<double>(shard));
      m.optimizer_scratch = std::max({m.optimizer_scratch, padded, gather});
      m.mpi_scratch = std::max(m.mpi_scratch, mpi);
      // ZeRO-1's own buffers come from the workspace (max with the pass scratch, below);
      // Open MPI's copy comes on top while the reduce-scatter runs.
      m.reduction_peak = std::max({m.reduction_peak, padded + mpi, gather});
    }
  }

  // Activations: each chunk keeps one slot per micro-batch alive in its schedule.
  const std::vector<dist::PipelineAction> actions = dist::pipeline_schedule(
      pc.schedule, layout.pp, stage, layout.virtual_stages, tc.microbatches);
  m.peak_live_microbatches = dist::peak_live_activations(actions);
  const TokenShape tokens{layout.local_rows,
                          tc.seq_len,
                          layout.ep,
                          pc.dispatch,
                          kept_expert_inputs(recipe),
                          tc.lm_head_chunk_tokens,
                          padded_capacity_factor(pc, layout.ep),
                          kept_mlp_act_dtype(recipe, SwigluMlp::kDenseLayer),
                          kept_mlp_act_dtype(recipe, SwigluMlp::kSharedExpert)};
  int64_t first_layer = 0;
  std::vector<int64_t> starts;
  for (int64_t n : layout.chunk_layers) {
    starts.push_back(first_layer);
    first_layer += n;
  }
  const int64_t chunks_total = static_cast<int64_t>(layout.chunk_layers.size());
  std::vector<ChunkShape> shapes;
  double first_chunk_scratch = 0.0;  // the workspace ZeRO-1 borrows (each chunk has its own)
  for (int64_t v = 0; v < layout.virtual_stages; ++v) {
    const int64_t g = stage + v * layout.pp;
    m.chunks.push_back(g);
    std::vector<dist::PipelineAction> mine;
    for (const dist::PipelineAction& a : actions)
      if (a.chunk == v) mine.push_back(a);
    const int64_t live = dist::peak_live_activations(mine);
    m.live_microbatches.push_back(live);
    const ChunkShape shape{starts[static_cast<size_t>(g)],
                           layout.chunk_layers[static_cast<size_t>(g)], g == 0,
                           g == chunks_total - 1};
    const ActivationBytes a = chunk_activation_bytes(mc, shape, tokens, tc.recompute);
    m.activations_per_microbatch.residual += a.residual;
    m.activations_per_microbatch.norms += a.norms;
    m.activations_per_microbatch.attention += a.attention;
    m.activations_per_microbatch.dense_mlp += a.dense_mlp;
    m.activations_per_microbatch.moe += a.moe;
    m.activations_per_microbatch.head += a.head;
    m.activations += static_cast<double>(live) * a.total();
    m.chunk_activations.push_back(a.total());
    m.lent_expert_inputs += lent_expert_input_bytes(mc, tokens);
    shapes.push_back(shape);
    const double scratch = chunk_pass_scratch_bytes(mc, shape, tokens);
    if (v == 0) first_chunk_scratch = scratch;
    m.pass_scratch += scratch;
    m.chunk_scratch.push_back(scratch);
    m.recompute_buffers += recompute_buffer_bytes(mc, shape, tokens, tc.recompute);
    if (shape.has_head && !tc.downstream_tasks.empty())
      m.downstream_logits =
          kF * static_cast<double>(tokens.head_rows()) * static_cast<double>(mc.vocab_size);
  }

  m.operand_copies = operand_copy_bytes(mc, shapes, tokens, recipe, device);

  // Rowwise dispatch: two symmetric windows (inputs, outputs) of capacity x d floats, capacity =
  // ceil(capacity_factor x routes of one rank). Without expert parallelism nothing is allocated.
  // The padded transport allocates none (its blocks are pass scratch).
  // The symmetric transport's padded blocks arrive in one window of NCCL's symmetric memory:
  // ep x block rows, in whole granules (dist::symmetric_window_bytes).
  const double routes = static_cast<double>(tokens.tokens() * mc.num_experts_per_tok);
  if (layout.ep > 1 && pc.dispatch == Dispatch::kRowwise && mc.num_experts > 0 &&
      tokens.padded_capacity_factor == 0.0) {
    m.dispatch_capacity_rows =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(pc.capacity_factor * routes)));
    m.dispatch_buffers = 2.0 * kF * static_cast<double>(m.dispatch_capacity_rows) *
                         static_cast<double>(mc.hidden_size);
  } else if (tokens.padded_capacity_factor > 0.0 &&
             pc.rowwise_transport == RowwiseTransport::kSymmetric && mc.num_experts > 0) {
    const int64_t block = static_cast<int64_t>(tokens.padded_block(routes));
    m.dispatch_capacity_rows = layout.ep * block;
    m.dispatch_buffers =
        static_cast<double>(dist::symmetric_window_bytes(layout.ep, block * mc.hidden_size));
  }
  if (layout.pp > 1)
    m.pipeline_buffers = kPipelineBuffers * kF * static_cast<double>(tokens.tokens()) *
                         static_cast<double>(mc.hidden_size);
  m.batch_tokens = 2.0 * kF * static_cast<double>(tc.microbatches * layout.micro_rows * tc.seq_len);
  m.runtime = runtime_bytes;
  m.merge_sums = merge_sum_bytes(
      tc, local, layout.dp, layout.ep_dp,
      !config.data.val.empty() || !config.data.lm_eval.empty() || !tc.downstream_tasks.empty());
  m.workspace = workspace_bytes(m, first_chunk_scratch);
  add_up_peak(m, device);
  return m;
}

RankMemory run_rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                           double runtime_bytes, bool device) {
  const ParamLayout local = ParamLayout::build(
      config.model, layout.ep, 0, dist::stage_chunks(layout.chunk_layers, layout.pp, stage));
  return run_rank_memory(config, layout, stage, runtime_bytes, device, local);
}

RankMemory run_rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                           double runtime_bytes, bool device, const ParamLayout& local) {
  const std::vector<StepShape> shapes = run_step_shapes(config.train, layout);
  if (shapes.size() == 1) return rank_memory(config, layout, stage, runtime_bytes, device, local);
  std::vector<RankMemory> each;
  for (const StepShape& shape : shapes)
    each.push_back(rank_memory(shaped_config(config, shape, layout), shaped_layout(layout, shape),
                               stage, runtime_bytes, device, local));
  // The first shape's figures (the run's own) are shown per micro-batch; the sizes are the
  // largest each buffer is given.
  RankMemory m = each.front();
  m.activations = 0.0;
  m.pass_scratch = 0.0;
  double first_chunk_scratch = 0.0;
  for (size_t c = 0; c < m.chunk_activations.size(); ++c) {
    // Each chunk's activation slots, each the largest micro-batch it held.
    std::vector<int64_t> live;
    std::vector<double> bytes;
    double scratch = 0.0;
    for (const RankMemory& e : each) {
      live.push_back(e.live_microbatches[c]);
      bytes.push_back(e.chunk_activations[c]);
      scratch = std::max(scratch, e.chunk_scratch[c]);
    }
    m.activations += slot_by_slot(live, bytes);
    m.live_microbatches[c] = *std::max_element(live.begin(), live.end());
    m.pass_scratch += scratch;
    if (c == 0) first_chunk_scratch = scratch;
  }
  m.peak_live_microbatches = 0;
  for (size_t i = 0; i < each.size(); ++i) {
    const RankMemory& e = each[i];
    m.peak_live_microbatches = std::max(m.peak_live_microbatches, e.peak_live_microbatches);
    m.lent_expert_inputs = std::max(m.lent_expert_inputs, e.lent_expert_inputs);
    m.operand_copies = std::max(m.operand_copies, e.operand_copies);
    m.recompute_buffers = std::max(m.recompute_buffers, e.recompute_buffers);
    m.dispatch_buffers = std::max(m.dispatch_buffers, e.dispatch_buffers);
    m.dispatch_capacity_rows = std::max(m.dispatch_capacity_rows, e.dispatch_capacity_rows);
    m.pipeline_buffers = std::max(m.pipeline_buffers, e.pipeline_buffers);
    m.downstream_logits = std::max(m.downstream_logits, e.downstream_logits);
    m.update_shapes.push_back(shapes[i]);
    m.shape_peaks.push_back(e.peak);
  }
  // The ids (the trainer's StepBuffers): each micro-batch's token and target vectors, every
  // rank's rows, keep the largest size they were given; the batch as read and a warm-up's cut
  // batch beside it, in vectors of their own. Vector k: the largest micro-batch k of the shapes
  // with more than k (the read ones are all one size; the warm-up's first holds its largest, as
  // its lengths rise and its micro-batches with them).
  auto ids = [&](bool cut) {
    std::vector<int64_t> vectors;
    std::vector<double> bytes;
    for (const StepShape& shape : shapes)
      if (shape.cut == cut) {
        vectors.push_back(shape.microbatches);
        bytes.push_back(2.0 * kF *
                        static_cast<double>(shape.local_rows * layout.dp * shape.seq_len));
      }
    return slot_by_slot(vectors, bytes);
  };
  m.batch_tokens = ids(false) + ids(true);
  m.workspace = workspace_bytes(m, first_chunk_scratch);
  add_up_peak(m, device);
  return m;
}

}  // namespace moecore::plan
