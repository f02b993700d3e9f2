// The arithmetic of moe_loss_terms and router_bias_update in the reference's order, shared by the
// CPU backend and the CUDA kernels (nvcc compiles this header: plain pointers, no library calls),
// so that both give the reference's bits: a run's logged losses, its routers' loss gradient and
// its selection bias do not depend on the device. The load-balancing loss is a sum of rows (per
// layer and group of tokens, or per expert in transformers' form), each summed on its own and the
// rows then added in order: the GPU gives a thread to each row (L x G x E values under
// lb_loss_granularity "instance" would be ~100k serial steps in one thread), the CPU walks them
// in turn. No product here feeds an addition directly, so a compiler's FMA contraction cannot
// change the bits.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/loss_parts.h"

namespace moecore::kernels {

// kernels/ops.h's MoeLossOptions, field for field (nvcc does not compile ops.h).
struct MoeLossScalars {
  bool lb_over_all_layers;
  int64_t top_k;
  double router_loss_div, tokens, z_rows, aux_loss_coef;
  int64_t lb_groups;
};

// Below, G = o.lb_groups: counts [layers, G experts], sums [layers, G experts + 1], head
// [head_chunks, kHeadLosses]; losses [kLossParts] (=), grad [layers, G experts] (=), tally
// [layers, experts] (+=) or null. kernels/op_declarations.inc states the rules.
//
// The load-balancing loss's rows: one per expert (transformers' form: every layer's routes as one
// set) or one per layer and group (OLMo-core's), layer-major.
MOECORE_HOST_DEVICE inline int64_t lb_row_count(int64_t layers, int64_t experts,
                                                const MoeLossScalars& o) {
  return o.lb_over_all_layers ? experts : layers * o.lb_groups;
}

// Whether the router losses are defined (otherwise lb, z and the gradient are 0).
MOECORE_HOST_DEVICE inline bool router_losses_defined(int64_t layers, const MoeLossScalars& o) {
  return layers > 0 && o.tokens > 0.0 && o.router_loss_div > 0.0;
}

// Row r's share of lb, its values summed in expert (or layer) order; writes the row's gradient
// values (every gradient value belongs to exactly one row; 0 where the losses are undefined).
MOECORE_HOST_DEVICE inline double lb_row_in_order(const int64_t* counts, const double* sums,
                                                  int64_t layers, int64_t experts,
                                                  const MoeLossScalars& o, int64_t r, float* grad) {
  const int64_t group_row = o.lb_groups * experts;  // a layer's counts: E per group
  const int64_t row = group_row + 1;                // a layer's sums: E per group, then z
  const bool defined = router_losses_defined(layers, o);
  const double e_count = static_cast<double>(experts);
  if (o.lb_over_all_layers) {  // row r: expert r over every layer (one group)
    if (!defined) {
      for (int64_t j = 0; j < layers; ++j) grad[j * experts + r] = 0.0f;
      return 0.0;
    }
    const double rows = o.tokens * static_cast<double>(layers);
    double routes = 0.0, probabilities = 0.0;
    for (int64_t j = 0; j < layers; ++j) {
      routes += static_cast<double>(counts[j * experts + r]);
      probabilities += sums[j * row + r];
    }
    const double f = routes / rows;
    const float g = static_cast<float>(o.aux_loss_coef * e_count * f / rows);
    for (int64_t j = 0; j < layers; ++j) grad[j * experts + r] = g;
    return e_count * f * probabilities / rows;
  }
  // Row r: layer r / G, group r % G.
  const int64_t first = (r / o.lb_groups) * group_row + (r % o.lb_groups) * experts;
  const int64_t* row_counts = counts + first;
  const double* row_sums = sums + (r / o.lb_groups) * row + (r % o.lb_groups) * experts;
  float* row_grad = grad + first;
  if (!defined) {
    for (int64_t e = 0; e < experts; ++e) row_grad[e] = 0.0f;
    return 0.0;
  }
  const double scale = e_count / static_cast<double>(o.top_k);
  const double group_tokens = o.tokens / static_cast<double>(o.lb_groups);
  double share = 0.0;
  for (int64_t e = 0; e < experts; ++e) {
    const double f = static_cast<double>(row_counts[e]) / o.router_loss_div;
    share += scale * f * row_sums[e] / group_tokens;
    row_grad[e] = static_cast<float>(o.aux_loss_coef * scale * f / group_tokens);
  }
  return share;
}

// losses: ce and lm_z over the head's chunks, z over the layers, each in order; lb as given (the
// rows' shares added in row order).
MOECORE_HOST_DEVICE inline void moe_loss_parts_in_order(const double* sums, const double* head,
                                                        int64_t layers, int64_t experts,
                                                        int64_t head_chunks,
                                                        const MoeLossScalars& o, double lb,
                                                        double* losses) {
  const int64_t row = o.lb_groups * experts + 1;
  double ce = 0.0, z = 0.0, lm_z = 0.0;
  for (int64_t c = 0; c < head_chunks; ++c) {
    ce += head[kHeadLosses * c + kHeadCe];
    lm_z += head[kHeadLosses * c + kHeadZ];
  }
  if (router_losses_defined(layers, o))
    for (int64_t j = 0; j < layers; ++j)
      z += sums[j * row + row - 1] * o.z_rows / o.router_loss_div;
  losses[kCeLoss] = ce;
  losses[kLbLoss] = lb;
  losses[kZLoss] = z;
  losses[kLmZLoss] = lm_z;
}

// tally[i] += the routes of layer i / E to expert i % E, the groups' counts added in order.
MOECORE_HOST_DEVICE inline void moe_tally_value(const int64_t* counts, int64_t experts,
                                                int64_t groups, int64_t i, double* tally) {
  const int64_t first = (i / experts) * groups * experts + i % experts;
  for (int64_t g = 0; g < groups; ++g) tally[i] += static_cast<double>(counts[first + g * experts]);
}

// The whole op in one thread (the CPU backend).
MOECORE_HOST_DEVICE inline void moe_loss_terms_in_order(const int64_t* counts, const double* sums,
                                                        const double* head, int64_t layers,
                                                        int64_t experts, int64_t head_chunks,
                                                        const MoeLossScalars& o, double* losses,
                                                        float* grad, double* tally) {
  double lb = 0.0;
  for (int64_t r = 0; r < lb_row_count(layers, experts, o); ++r)
    lb += lb_row_in_order(counts, sums, layers, experts, o, r, grad);
  moe_loss_parts_in_order(sums, head, layers, experts, head_chunks, o, lb, losses);
  if (tally != nullptr)
    for (int64_t i = 0; i < layers * experts; ++i)
      moe_tally_value(counts, experts, o.lb_groups, i, tally);
}

// bias [experts] += rate * sign(mean(counts) - counts[e]), sign(0) = 0; experts >= 1. Nothing
// when step_factors (f32 [2], or null) says the step is skipped.
MOECORE_HOST_DEVICE inline void router_bias_update_in_order(const double* counts, int64_t experts,
                                                            float rate, const float* step_factors,
                                                            float* bias) {
  if (step_factors != nullptr && step_factors[1] == 0.0f) return;
  double total = 0.0;
  for (int64_t e = 0; e < experts; ++e) total += counts[e];
  const double mean = total / static_cast<double>(experts);
  for (int64_t e = 0; e < experts; ++e)
    bias[e] += counts[e] < mean ? rate : counts[e] > mean ? -rate : 0.0f;
}

}  // namespace moecore::kernels
