#include "plan/step_time.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "dist/pipeline_schedule.h"
#include "model/bf16_weight_copies.h"
#include "model/flop_count.h"
#include "model/mx_weight_caches.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "plan/comm_model.h"
#include "plan/pipeline_simulation.h"
#include "plan/units.h"

namespace moecore::plan {

namespace {

// The measured bus bandwidth of a collective on a buffer of `buffer_bytes` within a node (0 when
// the profile has none), scaled from the measurement's ranks to this layout's share of the node
// (rank_share) like the link.
double measured_bus_bandwidth(const std::string& op, double buffer_bytes, const Rates& rates,
                              const ResolvedLayout& layout) {
  const double bus = op == "allreduce"        ? rates.allreduce_bus.at(buffer_bytes)
                     : op == "reduce_scatter" ? rates.reduce_scatter_bus.at(buffer_bytes)
                     : op == "allgather"      ? rates.allgather_bus.at(buffer_bytes)
                                              : 0.0;
  if (bus <= 0.0 || rates.async_communication) return bus;
  ResolvedLayout measured = layout;
  measured.world = rates.collective_ranks;
  return bus * rank_share(rates, layout) / rank_share(rates, measured);
}

// Seconds of one gradient-reduction collective as comm_model.h counts its bytes. Within a node
// with a measured bus bandwidth: the bus bytes (NCCL-tests' convention) at that rate. Otherwise
// the transfers over the group's link, and for the reducing ones the element-wise sum of what
// arrives (two operands read, one written) through memory at `memory_bandwidth`.
double collective_seconds(const CollectiveBytes& c, const ResolvedLayout& layout,
                          const Rates& rates, double memory_bandwidth) {
  const bool dense = c.group == "dp";
  const int64_t size = dense ? layout.dp : layout.ep_dp;
  const int64_t stride = dense ? 1 : layout.ep;
  const Link link = group_link(rates, layout, size, stride);
  const double n = static_cast<double>(size);
  // bytes: the buffer (all-reduce, reduce-scatter) or this rank's part (all-gather).
  const double buffer = c.op == "allgather" ? n * c.bytes : c.bytes;
  const double bus = group_on_one_node(rates, size, stride, layout.world)
                         ? measured_bus_bandwidth(c.op, buffer, rates, layout)
                         : 0.0;
  if (bus > 0.0) {
    const double bus_bytes = (c.op == "allreduce" ? 2.0 : 1.0) * (n - 1.0) / n * buffer;
    return bus_bytes / bus + (c.op == "allreduce" ? 2.0 : 1.0) * (n - 1.0) * link.latency;
  }
  const double sum = 3.0 * (n - 1.0) / n * c.bytes / memory_bandwidth;
  if (c.op == "allreduce")  // ring: reduce-scatter then all-gather of the whole buffer
    return 2.0 * (n - 1.0) / n * c.bytes / link.bandwidth + 2.0 * (n - 1.0) * link.latency + sum;
  if (c.op == "reduce_scatter")  // bytes: the whole send buffer
    return (n - 1.0) / n * c.bytes / link.bandwidth + (n - 1.0) * link.latency + sum;
  if (c.op == "allgather")  // bytes: this rank's part
    return (n - 1.0) * c.bytes / link.bandwidth + (n - 1.0) * link.latency;
  return 0.0;
}

}  // namespace

StepTime step_time(const RunConfig& config, const ResolvedLayout& layout, const Rates& rates) {
  MOE_CHECK(rates.known(),
            "[plan] hardware profile has no rates for a step time (gemm, memory, link)");
  const ModelConfig& mc = config.model;
  const TrainConfig& tc = config.train;
  const ParallelConfig& pc = config.parallel;
  const int64_t chunks_total = static_cast<int64_t>(layout.chunk_layers.size());
  std::vector<int64_t> first_layer(static_cast<size_t>(chunks_total + 1), 0);
  for (int64_t g = 0; g < chunks_total; ++g)
    first_layer[static_cast<size_t>(g + 1)] =
        first_layer[static_cast<size_t>(g)] + layout.chunk_layers[static_cast<size_t>(g)];

  std::vector<std::vector<Seconds>> forward(static_cast<size_t>(layout.pp)),
      backward(static_cast<size_t>(layout.pp));
  for (int64_t s = 0; s < layout.pp; ++s)
    for (int64_t c = 0; c < layout.virtual_stages; ++c) {
      const int64_t g = s + c * layout.pp;
      const ChunkShape chunk{first_layer[static_cast<size_t>(g)],
                             layout.chunk_layers[static_cast<size_t>(g)], g == 0,
                             g == chunks_total - 1};
      forward[static_cast<size_t>(s)].push_back(
          chunk_pass_seconds(config, layout, chunk, rates, true));
      backward[static_cast<size_t>(s)].push_back(
          chunk_pass_seconds(config, layout, chunk, rates, false));
    }
  // A hidden state (or its gradient) between neighbouring stages, dp ranks apart.
  double transfer = 0.0;
  if (layout.pp > 1) {
    const Link link = group_link(rates, layout, layout.pp, layout.dp);
    transfer =
        kF * static_cast<double>(layout.local_rows * tc.seq_len * mc.hidden_size) / link.bandwidth +
        link.latency;
  }
  const PipelineTimeline timeline = simulate_pipeline(pc.schedule, layout.pp, layout.virtual_stages,
                                                      tc.microbatches, forward, backward, transfer);

  const double share = rank_share(rates, layout);
  StepTime out;
  for (int64_t s = 0; s < layout.pp; ++s) {
    const auto ss = static_cast<size_t>(s);
    double reduce = 0.0;
    for (const CollectiveBytes& c : rank_collectives(config, layout, s))
      reduce += collective_seconds(c, layout, rates, rates.memory_bandwidth * share);
    const bool overlap = pc.overlap_grad_reduce && rates.async_communication;
    // Overlapped, the reductions still cannot finish before the stage's last layer's gradients.
    int64_t stage_layers = 0;
    for (int64_t c = 0; c < layout.virtual_stages; ++c)
      stage_layers += layout.chunk_layers[static_cast<size_t>(s + c * layout.pp)];
    const double exposed = overlap ? std::max(reduce / static_cast<double>(stage_layers),
                                              reduce - timeline.last_backward[ss])
                                   : reduce;
    // AdamW reads parameter, gradient and both moments and writes three of them (28 bytes per
    // float of this rank's shard); zeroing the gradients and their norm touch every local float.
    const std::vector<LayerRange> ranges = dist::stage_chunks(layout.chunk_layers, layout.pp, s);
    const ParamLayout local = ParamLayout::build(mc, layout.ep, 0, ranges);
    const double dense = static_cast<double>(local.numel(ParamGroup::kDense));
    const double expert = static_cast<double>(local.numel(ParamGroup::kExpert));
    const double shard = pc.zero != 0 ? dense / static_cast<double>(layout.dp) +
                                            expert / static_cast<double>(layout.ep_dp)
                                      : dense + expert;
    const double optimizer =
        (28.0 * shard + 2.0 * kF * (dense + expert)) / (rates.memory_bandwidth * share);
    // ZeRO-1's copies around its collectives: every local gradient into the zeroed, padded send
    // buffer of the reduce-scatter (4 bytes written, then 4 read and 4 written per float) and the
    // gathered weights back into place (4 read, 4 written).
    const double zero_copies =
        pc.zero != 0 ? 20.0 * (dense + expert) / (rates.memory_bandwidth * share) : 0.0;
    // After the step, the low-precision weight copies are made again (model/bf16_weight_copies.h,
    // mx_weight_caches.h): a bf16 copy reads 4 bytes and writes 2 per weight; an MX cache
    // quantises each weight into both orientations, at the measured refresh rate (else a memory
    // pass: 4 bytes read, twice 1 byte and a scale per 32 written).
    const PrecisionRecipe recipe = PrecisionRecipe::from_train(tc.precision, tc.mxfp8);
    double bf16_copied = 0.0, mx_cached = 0.0;
    for (const LayerRange& range : ranges) {
      for (const ParamRange& copy : bf16_copy_ranges(mc, local, range, recipe))
        bf16_copied += static_cast<double>(copy.numel);
      for (const MxWeightRange& cache : mx_weight_ranges(mc, local, range, recipe))
        mx_cached += static_cast<double>(cache.batch * cache.out * cache.in);
    }
    const double refresh_rate =
        share * (rates.mx_weight_refresh_values > 0.0
                     ? rates.mx_weight_refresh_values
                     : rates.memory_bandwidth / (4.0 + 2.0 * (1.0 + 1.0 / 32.0)));
    const double copies =
        6.0 * bf16_copied / (rates.memory_bandwidth * share) + mx_cached / refresh_rate;

    Seconds b = timeline.busy[ss];
    b[static_cast<int>(TimeCategory::kPipelineWait)] += timeline.wait[ss];
    b[static_cast<int>(TimeCategory::kGradReduce)] += exposed + zero_copies;
    b[static_cast<int>(TimeCategory::kOptimizer)] += optimizer + copies;
    const double seconds = total_seconds(b);
    out.stage_seconds.push_back(seconds);
    if (s == 0 || seconds > out.seconds) {
      out.seconds = seconds;
      out.critical_stage = s;
      out.breakdown = b;
    }
  }
  // The other stages wait for the slowest at the next step's first collective: the critical
  // stage's breakdown is the step's.
  const double tokens = static_cast<double>(tc.batch_size * tc.seq_len);
  out.tokens_per_s_per_rank = tokens / out.seconds / static_cast<double>(layout.world);
  out.model_flops_per_s_per_rank =
      out.tokens_per_s_per_rank * flops_per_token(mc, tc.seq_len).total();
  const bool bf16 = tc.precision != TrainPrecision::kFp32;
  const double peak = bf16 ? rates.peak_flops_bf16 : rates.peak_flops_fp32;
  out.mfu = peak > 0.0 ? out.model_flops_per_s_per_rank / peak : 0.0;
  out.bubble = out.breakdown[static_cast<int>(TimeCategory::kPipelineWait)] / out.seconds;
  return out;
}

}  // namespace moecore::plan
