#include "train/moe_metrics.h"

#include <algorithm>
#include <cmath>

namespace moecore {

namespace {

// The means and maxima over the layers.
void summarize(MoeMetrics& m) {
  m.mean_load_imbalance = m.max_load_imbalance = m.mean_router_entropy = 0.0;
  m.mean_selected_mass = m.drop_rate = 0.0;
  if (m.layers.empty()) return;
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
}

}  // namespace

MoeMetrics compute_moe_metrics(const Transformer& model, const std::vector<double>& drop_rates) {
  return compute_moe_metrics(std::vector<const Transformer*>{&model}, drop_rates);
}

MoeMetrics compute_moe_metrics(const std::vector<const Transformer*>& chunks,
                               const std::vector<double>& drop_rates,
                               const std::function<void(double*, int64_t)>& sum_over_ranks) {
  const ModelConfig& c = chunks.front()->config();
  const int64_t e_count = c.num_experts, k = c.num_experts_per_tok;
  // Per MoE layer the sums the metrics are ratios of, over this rank's tokens: [tokens, routes
  // per expert (E), load-balancing probability per expert (E), z, entropy, selected mass]. Summed
  // over the data-parallel ranks they are the whole batch's, as one process measures it.
  const int64_t width = 2 * e_count + 4;
  std::vector<int64_t> moe_layers;
  std::vector<double> sums;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const RouterState* st = nullptr;
    for (const Transformer* chunk : chunks)
      if (st == nullptr) st = chunk->router_state(i);
    if (st == nullptr) continue;
    moe_layers.push_back(i);
    sums.resize(sums.size() + static_cast<size_t>(width), 0.0);
    double* row = sums.data() + sums.size() - static_cast<size_t>(width);
    double* counts = row + 1;
    double* score_sums = counts + e_count;
    double* tail = score_sums + e_count;  // z, entropy, selected mass
    const int64_t tokens = static_cast<int64_t>(st->logits.size()) / e_count;
    if (tokens == 0) continue;
    row[0] = static_cast<double>(tokens);
    const std::vector<int64_t> expert_counts = host_copy(st->expert_counts);
    for (int64_t e = 0; e < e_count; ++e)
      counts[e] = static_cast<double>(expert_counts[static_cast<size_t>(e)]);

    // The router's tensors where this host loop can read them (copied when they are a device's).
    std::vector<float> logits_copy, scores_copy;
    std::vector<int32_t> topk_copy;
    const std::span<const float> logits = host_readable(st->logits, logits_copy);
    const std::span<const float> scores = host_readable(st->scores, scores_copy);
    const std::span<const int32_t> topk_index = host_readable(st->topk_index, topk_copy);
    std::vector<double> prob(static_cast<size_t>(e_count));
    for (int64_t t = 0; t < tokens; ++t) {
      const float* z = logits.data() + t * e_count;
      const float* s = scores.data() + t * e_count;
      const double max_z = static_cast<double>(*std::max_element(z, z + e_count));
      double sum = 0.0;
      // The load-balancing probabilities: the scores, each token's sigmoid scores divided by
      // their sum (OLMo-core).
      double score_total = 1.0;
      if (c.router_score == RouterScore::kSigmoid) {
        score_total = 0.0;
        for (int64_t e = 0; e < e_count; ++e) score_total += static_cast<double>(s[e]);
      }
      for (int64_t e = 0; e < e_count; ++e) {
        prob[static_cast<size_t>(e)] = std::exp(static_cast<double>(z[e]) - max_z);
        sum += prob[static_cast<size_t>(e)];
        score_sums[e] += static_cast<double>(s[e]) / score_total;
      }
      const double lse = max_z + std::log(sum);
      tail[0] += lse * lse;
      double entropy = 0.0;
      for (double p : prob) {
        const double q = p / sum;
        if (q > 0.0) entropy -= q * std::log(q);
      }
      tail[1] += entropy;
      for (int64_t j = 0; j < k; ++j)
        tail[2] += static_cast<double>(s[topk_index[static_cast<size_t>(t * k + j)]]);
    }
  }
  if (sum_over_ranks) sum_over_ranks(sums.data(), static_cast<int64_t>(sums.size()));

  MoeMetrics m;
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    const double* row = sums.data() + l * static_cast<size_t>(width);
    const double* counts = row + 1;
    const double* score_sums = counts + e_count;
    const double* tail = score_sums + e_count;
    const double n = row[0];
    if (n == 0.0) continue;
    MoeLayerMetrics lm;
    lm.layer = moe_layers[l];
    if (l < drop_rates.size()) lm.drop_rate = drop_rates[l];  // one per MoE layer, as moe_layers
    for (int64_t e = 0; e < e_count; ++e) lm.tokens_per_expert.push_back(std::llround(counts[e]));
    const double mean_count = n * static_cast<double>(k) / static_cast<double>(e_count);
    lm.load_imbalance = *std::max_element(counts, counts + e_count) / mean_count;
    lm.z_loss = tail[0] / n;
    lm.router_entropy = tail[1] / n;
    lm.selected_mass = tail[2] / n;
    for (int64_t e = 0; e < e_count; ++e)
      lm.lb_loss += static_cast<double>(e_count) / static_cast<double>(k) * (counts[e] / n) *
                    (score_sums[e] / n);
    m.layers.push_back(std::move(lm));
  }
  summarize(m);
  return m;
}

MoeMetrics combine_stage_metrics(const MoeMetrics& mine, const ModelConfig& c,
                                 const std::function<void(double*, int64_t)>& sum_over_stages) {
  // One row per layer: [present, tokens per expert (E), imbalance, lb, z, entropy, mass, drop];
  // the stages hold disjoint layers, so the sum puts each layer's row in place.
  const int64_t e_count = c.num_experts, width = e_count + 7;
  std::vector<double> rows(static_cast<size_t>(c.num_hidden_layers * width), 0.0);
  for (const MoeLayerMetrics& lm : mine.layers) {
    double* row = rows.data() + lm.layer * width;
    row[0] = 1.0;
    for (int64_t e = 0; e < e_count; ++e)
      row[1 + e] = static_cast<double>(lm.tokens_per_expert[static_cast<size_t>(e)]);
    double* tail = row + 1 + e_count;
    tail[0] = lm.load_imbalance;
    tail[1] = lm.lb_loss;
    tail[2] = lm.z_loss;
    tail[3] = lm.router_entropy;
    tail[4] = lm.selected_mass;
    tail[5] = lm.drop_rate;
  }
  sum_over_stages(rows.data(), static_cast<int64_t>(rows.size()));
  MoeMetrics all;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const double* row = rows.data() + i * width;
    if (row[0] == 0.0) continue;
    MoeLayerMetrics lm;
    lm.layer = i;
    for (int64_t e = 0; e < e_count; ++e)
      lm.tokens_per_expert.push_back(static_cast<int64_t>(row[1 + e]));
    const double* tail = row + 1 + e_count;
    lm.load_imbalance = tail[0];
    lm.lb_loss = tail[1];
    lm.z_loss = tail[2];
    lm.router_entropy = tail[3];
    lm.selected_mass = tail[4];
    lm.drop_rate = tail[5];
    all.layers.push_back(std::move(lm));
  }
  summarize(all);
  return all;
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
