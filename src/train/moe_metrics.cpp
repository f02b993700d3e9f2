#include "train/moe_metrics.h"

#include <algorithm>
#include <cmath>

namespace moecore {

MoeMetrics compute_moe_metrics(const Transformer& model, const std::vector<double>& drop_rates) {
  const ModelConfig& c = model.config();
  MoeMetrics m;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const RouterState* st = model.router_state(i);
    if (st == nullptr || st->logits.empty()) continue;
    const int64_t e_count = c.num_experts, k = c.num_experts_per_tok;
    const int64_t tokens = static_cast<int64_t>(st->logits.size()) / e_count;
    MoeLayerMetrics lm;
    lm.layer = i;
    if (m.layers.size() < drop_rates.size()) lm.drop_rate = drop_rates[m.layers.size()];
    lm.tokens_per_expert = st->expert_counts;
    const double mean_count = static_cast<double>(tokens * k) / static_cast<double>(e_count);
    const int64_t max_count = *std::max_element(st->expert_counts.begin(), st->expert_counts.end());
    lm.load_imbalance = mean_count > 0 ? static_cast<double>(max_count) / mean_count : 0.0;

    std::vector<double> score_sums(static_cast<size_t>(e_count), 0.0);
    std::vector<double> prob(static_cast<size_t>(e_count));
    for (int64_t t = 0; t < tokens; ++t) {
      const float* z = st->logits.data() + t * e_count;
      const float* s = st->scores.data() + t * e_count;
      const double max_z = static_cast<double>(*std::max_element(z, z + e_count));
      double sum = 0.0;
      for (int64_t e = 0; e < e_count; ++e) {
        prob[static_cast<size_t>(e)] = std::exp(static_cast<double>(z[e]) - max_z);
        sum += prob[static_cast<size_t>(e)];
        score_sums[static_cast<size_t>(e)] += static_cast<double>(s[e]);
      }
      const double lse = max_z + std::log(sum);
      lm.z_loss += lse * lse;
      double entropy = 0.0;
      for (double p : prob) {
        const double q = p / sum;
        if (q > 0.0) entropy -= q * std::log(q);
      }
      lm.router_entropy += entropy;
      for (int64_t j = 0; j < k; ++j)
        lm.selected_mass += static_cast<double>(s[st->topk_index[static_cast<size_t>(t * k + j)]]);
    }
    const double n = static_cast<double>(std::max<int64_t>(1, tokens));
    lm.z_loss /= n;
    lm.router_entropy /= n;
    lm.selected_mass /= n;
    for (int64_t e = 0; e < e_count; ++e)
      lm.lb_loss += static_cast<double>(e_count) / static_cast<double>(k) *
                    (static_cast<double>(st->expert_counts[static_cast<size_t>(e)]) / n) *
                    (score_sums[static_cast<size_t>(e)] / n);
    m.layers.push_back(std::move(lm));
  }
  if (m.layers.empty()) return m;
  for (const MoeLayerMetrics& lm : m.layers) {
    m.mean_load_imbalance += lm.load_imbalance;
    m.max_load_imbalance = std::max(m.max_load_imbalance, lm.load_imbalance);
    m.mean_router_entropy += lm.router_entropy;
    m.mean_selected_mass += lm.selected_mass;
    m.drop_rate += lm.drop_rate;
  }
  const double layers = static_cast<double>(m.layers.size());
  m.mean_load_imbalance /= layers;
  m.mean_router_entropy /= layers;
  m.mean_selected_mass /= layers;
  m.drop_rate /= layers;
  return m;
}

std::vector<std::pair<std::string, double>> MoeMetrics::scalars(bool per_expert_counts) const {
  std::vector<std::pair<std::string, double>> out = {
      {"moe/load_imbalance", mean_load_imbalance},
      {"moe/max_load_imbalance", max_load_imbalance},
      {"moe/router_entropy", mean_router_entropy},
      {"moe/selected_mass", mean_selected_mass},
      {"moe/drop_rate", drop_rate},
  };
  for (const MoeLayerMetrics& lm : layers) {
    const std::string p = "moe/layer" + std::to_string(lm.layer) + "/";
    out.emplace_back(p + "load_imbalance", lm.load_imbalance);
    out.emplace_back(p + "lb_loss", lm.lb_loss);
    out.emplace_back(p + "z_loss", lm.z_loss);
    out.emplace_back(p + "router_entropy", lm.router_entropy);
    out.emplace_back(p + "selected_mass", lm.selected_mass);
    out.emplace_back(p + "drop_rate", lm.drop_rate);
    if (per_expert_counts)
      for (size_t e = 0; e < lm.tokens_per_expert.size(); ++e)
        out.emplace_back(p + "tokens_expert" + std::to_string(e),
                         static_cast<double>(lm.tokens_per_expert[e]));
  }
  return out;
}

}  // namespace moecore
