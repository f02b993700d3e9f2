// Per-layer and aggregated MoE diagnostics from the router state of the last forward pass.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.h"

namespace moecore {

struct MoeLayerMetrics {
  int64_t layer = 0;
  std::vector<int64_t> tokens_per_expert;  // (token, slot) routes per expert
  double load_imbalance = 0.0;  // max / mean of tokens_per_expert (1.0 = perfectly balanced)
  double lb_loss = 0.0;         // OLMo-core form (E/k) sum_e f_e P_e for this layer (1.0 balanced)
  double z_loss = 0.0;          // mean over tokens of logsumexp(logits)^2
  double router_entropy = 0.0;  // mean over tokens of the entropy of softmax(logits), in nats
  double selected_mass = 0.0;   // mean over tokens of the sum of the k selected scores
  double drop_rate = 0.0;       // routes dropped by a capacity limit (0 while routing is dropless)
};

struct MoeMetrics {
  std::vector<MoeLayerMetrics> layers;
  double mean_load_imbalance = 0.0;
  double max_load_imbalance = 0.0;
  double mean_router_entropy = 0.0;
  double mean_selected_mass = 0.0;
  double drop_rate = 0.0;

  // Flat (name, value) pairs for the metrics sink: moe/<metric> and moe/layer<i>/<metric>.
  std::vector<std::pair<std::string, double>> scalars(bool per_expert_counts) const;
};

// drop_rates: per MoE layer (in layer order), the fraction of routes a capacity limit dropped
// (empty: dropless routing).
MoeMetrics compute_moe_metrics(const Transformer& model,
                               const std::vector<double>& drop_rates = {});
// Over the model chunks of a pipeline stage (drop_rates per MoE layer of these chunks). With
// data parallelism each rank routed its own tokens: `sum_over_ranks` (an all-reduce over the
// stage's data-parallel group, called by every rank of it) makes the metrics the whole batch's.
MoeMetrics compute_moe_metrics(const std::vector<const Transformer*>& chunks,
                               const std::vector<double>& drop_rates = {},
                               const std::function<void(double*, int64_t)>& sum_over_ranks = {});

// With pipeline parallelism each stage measures its own layers: every stage calls this with its
// metrics and a sum over the stages (an all-reduce), and gets the whole model's.
MoeMetrics combine_stage_metrics(const MoeMetrics& mine, const ModelConfig& config,
                                 const std::function<void(double*, int64_t)>& sum_over_stages);

}  // namespace moecore
