// The arithmetic of moe_loss_terms and router_bias_update as one serial walk in the reference's
// order, shared by the CPU backend and the CUDA kernel (nvcc compiles this header: plain pointers,
// no library calls), so that both give the reference's bits: a run's logged losses, its routers'
// loss gradient and its selection bias do not depend on the device. A few thousand values per
// micro-batch: one thread is enough; what matters is where it runs (on the device, so that no
// pass waits for the host to read the statistics). No product here feeds an addition directly,
// so a compiler's FMA contraction cannot change the bits.
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

// G = o.lb_groups: counts [layers, G experts], sums [layers, G experts + 1], head [head_chunks,
// kHeadLosses]; losses [kLossParts] (=), grad [layers, G experts] (=), tally [layers, experts]
// (+=) or null. kernels/op_declarations.inc states the rules.
MOECORE_HOST_DEVICE inline void moe_loss_terms_in_order(const int64_t* counts, const double* sums,
                                                        const double* head, int64_t layers,
                                                        int64_t experts, int64_t head_chunks,
                                                        const MoeLossScalars& o, double* losses,
                                                        float* grad, double* tally) {
  const int64_t group_row = o.lb_groups * experts;  // a layer's counts: E per group
  const int64_t row = group_row + 1;                // a layer's sums: E per group, then z
  double ce = 0.0, lb = 0.0, z = 0.0, lm_z = 0.0;
  for (int64_t c = 0; c < head_chunks; ++c) {
    ce += head[kHeadLosses * c + kHeadCe];
    lm_z += head[kHeadLosses * c + kHeadZ];
  }
  for (int64_t i = 0; i < layers * group_row; ++i) grad[i] = 0.0f;
  if (layers > 0 && o.tokens > 0.0 && o.router_loss_div > 0.0) {
    for (int64_t j = 0; j < layers; ++j)
      z += sums[j * row + group_row] * o.z_rows / o.router_loss_div;
    const double e_count = static_cast<double>(experts);
    if (o.lb_over_all_layers) {  // one group
      const double rows = o.tokens * static_cast<double>(layers);
      for (int64_t e = 0; e < experts; ++e) {
        double routes = 0.0, probabilities = 0.0;
        for (int64_t j = 0; j < layers; ++j) {
          routes += static_cast<double>(counts[j * experts + e]);
          probabilities += sums[j * row + e];
        }
        const double f = routes / rows;
        lb += e_count * f * probabilities / rows;
        const float g = static_cast<float>(o.aux_loss_coef * e_count * f / rows);
        for (int64_t j = 0; j < layers; ++j) grad[j * experts + e] = g;
      }
    } else {
      const double scale = e_count / static_cast<double>(o.top_k);
      const double group_tokens = o.tokens / static_cast<double>(o.lb_groups);
      for (int64_t j = 0; j < layers; ++j)
        for (int64_t i = 0; i < group_row; ++i) {
          const double f = static_cast<double>(counts[j * group_row + i]) / o.router_loss_div;
          lb += scale * f * sums[j * row + i] / group_tokens;
          grad[j * group_row + i] = static_cast<float>(o.aux_loss_coef * scale * f / group_tokens);
        }
    }
  }
  losses[kCeLoss] = ce;
  losses[kLbLoss] = lb;
  losses[kZLoss] = z;
  losses[kLmZLoss] = lm_z;
  if (tally != nullptr)
    for (int64_t j = 0; j < layers; ++j)
      for (int64_t i = 0; i < group_row; ++i)
        tally[j * experts + i % experts] += static_cast<double>(counts[j * group_row + i]);
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
