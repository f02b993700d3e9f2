#include "plan/comm_model.h"

#include <tuple>

#include "dist/pipeline_schedule.h"
#include "model/params.h"
#include "plan/activation_model.h"
#include "plan/units.h"

namespace moecore::plan {

std::vector<CollectiveBytes> rank_collectives(const RunConfig& config, const ResolvedLayout& layout,
                                              int64_t stage) {
  const ModelConfig& mc = config.model;
  const ParallelConfig& pc = config.parallel;
  const TrainConfig& tc = config.train;
  const std::vector<LayerRange> ranges = dist::stage_chunks(layout.chunk_layers, layout.pp, stage);
  const ParamLayout local = ParamLayout::build(mc, layout.ep, 0, ranges);
  const int64_t dense = static_cast<int64_t>(local.numel(ParamGroup::kDense));
  const int64_t expert = static_cast<int64_t>(local.numel(ParamGroup::kExpert));
  std::vector<CollectiveBytes> out;

  // Gradients: all-reduced, or under ZeRO-1 reduce-scattered (padded to ranks x shard) and the
  // updated weights all-gathered (one shard from each rank).
  for (const auto& [group, numel, ranks] :
       {std::tuple{std::string("dp"), dense, layout.dp},
        std::tuple{std::string("ep_dp"), expert, layout.ep_dp}}) {
    if (ranks <= 1 || numel == 0) continue;
    const std::string kind = group == "dp" ? "dense" : "expert";
    if (pc.zero == 0) {
      out.push_back({group, "allreduce", kind + " gradients", kF * static_cast<double>(numel)});
    } else {
      const double shard = static_cast<double>((numel + ranks - 1) / ranks);
      out.push_back(
          {group, "reduce_scatter", kind + " gradients", kF * shard * static_cast<double>(ranks)});
      out.push_back({group, "allgather", kind + " weights", kF * shard});
    }
  }

  // Expert parallelism: per MoE layer of this stage and micro-batch, the routes bound for other
  // ranks travel four times (inputs and output gradients out, outputs and input gradients back),
  // six when the backward re-runs the MoE forward (train.recompute full or moe).
  int64_t moe_layers = 0;
  for (const LayerRange& r : ranges)
    for (int64_t i = r.begin; i < r.end; ++i) moe_layers += mc.layer_is_dense(i) ? 0 : 1;
  const double tokens = static_cast<double>(layout.local_rows * tc.seq_len);
  const double d = static_cast<double>(mc.hidden_size);
  const double m = static_cast<double>(tc.microbatches);
  if (layout.ep > 1 && moe_layers > 0) {
    const double remote_rows = tokens * static_cast<double>(mc.num_experts_per_tok) *
                               static_cast<double>(layout.ep - 1) / static_cast<double>(layout.ep);
    const double one_way = kF * remote_rows * d * static_cast<double>(moe_layers) * m;
    const double forwards = recomputes_ffn(tc.recompute) ? 2.0 : 1.0;
    if (pc.dispatch == Dispatch::kSync) {
      out.push_back(
          {"ep", "alltoallv", "token rows and their gradients", (2.0 * forwards + 2.0) * one_way});
    } else if (moves_padded_blocks(pc.rowwise_transport)) {
      // Static blocks of min(capacity, routes) rows to every other rank, empty slots included
      // (model/padded_dispatch.h), with the routing of the micro-batch's tokens on this rank.
      const double routes = tokens * static_cast<double>(mc.num_experts_per_tok);
      const double block = padded_block_rows(pc.capacity_factor, routes);
      const double blocks =
          kF * block * d * static_cast<double>(layout.ep - 1) * static_cast<double>(moe_layers) * m;
      out.push_back({"ep", "alltoall", "token rows and their gradients in padded blocks",
                     (2.0 * forwards + 2.0) * blocks});
    } else {
      out.push_back({"ep", "put", "token rows and output gradients", (forwards + 1.0) * one_way});
      out.push_back(
          {"ep", "get", "expert outputs and input gradients", (forwards + 1.0) * one_way});
    }
  }

  // Pipeline: a hidden state forward from every chunk but the model's last, a gradient backward
  // from every chunk but the first, per micro-batch.
  if (layout.pp > 1) {
    const int64_t chunks_total = static_cast<int64_t>(layout.chunk_layers.size());
    double sends = 0.0;
    for (int64_t v = 0; v < layout.virtual_stages; ++v) {
      const int64_t g = stage + v * layout.pp;
      sends += (g < chunks_total - 1 ? 1.0 : 0.0) + (g > 0 ? 1.0 : 0.0);
    }
    out.push_back({"pp", "send", "hidden states and their gradients", kF * tokens * d * m * sends});
  }
  return out;
}

}  // namespace moecore::plan
