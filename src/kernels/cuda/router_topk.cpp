// The router on the GPU (router_topk.cu), checked as the CPU backend checks it. The forward's
// expert counts, the z-loss and the column sums stay where the views are (device memory): nothing
// here copies them back or waits for the stream (kernels/op_declarations.inc).
#include <algorithm>
#include <cstddef>

#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::cuda {

namespace {

// The groups of tokens one launch of the per-group statistics takes (a grid dimension).
constexpr int64_t kMaxTokenGroups = 65535;

RouterTopkParams params_of(const RouterTopkOptions& o) {
  return {.sigmoid = o.score == RouterScoreFunction::kSigmoid,
          .topk_softmax = o.score == RouterScoreFunction::kTopkSoftmax,
          .norm_topk_prob = o.norm_topk_prob,
          .random = o.choice == RouterChoice::kRandom,
          .balanced = o.choice == RouterChoice::kBalanced,
          .top_k = o.top_k,
          .n_group = o.n_group,
          .topk_group = o.topk_group,
          .routed_scaling_factor = o.routed_scaling_factor,
          .seed = o.seed,
          .token_offset = o.token_offset};
}

RouterColumnValue column_value_of(RouterProbability probability) {
  switch (probability) {
    case RouterProbability::kScores:
      return RouterColumnValue::kScores;
    case RouterProbability::kSoftmaxOfLogits:
      return RouterColumnValue::kSoftmaxOfLogits;
    case RouterProbability::kScoresOverRowSum:
      return RouterColumnValue::kScoresOverRowSum;
  }
  fail("[router_probability_column_sums] unknown probability {}", static_cast<int>(probability));
}

}  // namespace

void router_topk_forward(ConstTensorView logits, ConstTensorView selection_bias,
                         const RouterTopkOptions& o, TensorView scores, TensorView topk_index,
                         TensorView topk_weight, TensorView expert_counts) {
  constexpr const char* kOp = "router_topk";
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "scores", scores);
  expect_on_device(kOp, "topk_index", topk_index);
  expect_on_device(kOp, "topk_weight", topk_weight);
  expect_on_device(kOp, "expert_counts", expert_counts);
  const RouterDims s = router_dims(kOp, logits, o, Device::kCuda);
  const int64_t n = s.tokens, e_count = s.experts;
  expect_router_outputs(kOp, s, o.top_k, scores, topk_index, topk_weight, expert_counts,
                        Device::kCuda);
  const float* bias = nullptr;
  // An empty view (no data) is no bias, whatever its device.
  if (selection_bias.raw() != nullptr) {
    expect_on_device(kOp, "selection_bias", selection_bias);
    expect_shape(kOp, "selection_bias", selection_bias, {e_count}, Device::kCuda);
    bias = selection_bias.data<float>(kOp);
  }
  const float* zp = logits.data<float>(kOp);
  float* pp = scores.data<float>(kOp);
  int32_t* index = topk_index.data<int32_t>(kOp);
  float* weight = topk_weight.data<float>(kOp);
  // The counts stay on the device (no wait for the routing here): zeroed, then counted.
  int64_t* counts = expert_counts.data<int64_t>(kOp);
  MOE_CUDA_CHECK(
      cudaMemsetAsync(counts, 0, sizeof(int64_t) * static_cast<size_t>(e_count), stream()));
  if (n == 0) return;
  // The group scores of the group-limited choice.
  const bool grouped = o.n_group > 1 && o.choice == RouterChoice::kTopScores;
  const size_t group_bytes = grouped ? sizeof(float) * static_cast<size_t>(n * o.n_group) : 0;
  const StreamScratch scratch(group_bytes, stream());
  float* group_scores = grouped ? scratch.as<float>() : nullptr;
  launch_router_topk_forward(zp, bias, pp, index, weight, counts, group_scores, n, e_count,
                             params_of(o), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_router_topk_forward");
}

void router_topk_backward(ConstTensorView logits, ConstTensorView scores,
                          ConstTensorView topk_index, ConstTensorView topk_weight,
                          ConstTensorView d_weight, const RouterLossGrads& g,
                          const RouterTopkOptions& o, TensorView dlogits) {
  constexpr const char* kOp = "router_topk_backward";
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "scores", scores);
  expect_on_device(kOp, "topk_index", topk_index);
  expect_on_device(kOp, "topk_weight", topk_weight);
  expect_on_device(kOp, "d_weight", d_weight);
  expect_on_device(kOp, "dlogits", dlogits);
  const RouterDims s = router_dims(kOp, logits, o, Device::kCuda);
  const int64_t n = s.tokens, e_count = s.experts, k = o.top_k;
  expect_shape(kOp, "scores", scores, {n, e_count}, Device::kCuda);
  expect_shape(kOp, "topk_index", topk_index, {n, k}, Device::kCuda);
  expect_shape(kOp, "topk_weight", topk_weight, {n, k}, Device::kCuda);
  expect_shape(kOp, "d_weight", d_weight, {n, k}, Device::kCuda);
  expect_shape(kOp, "dlogits", dlogits, {n, e_count}, Device::kCuda);
  const float* lb = nullptr;
  int64_t group_tokens = n;
  if (g.lb_score_grad.raw() != nullptr) {
    expect_on_device(kOp, "lb_score_grad", g.lb_score_grad);
    group_tokens =
        n / token_groups(kOp, "lb_score_grad", g.lb_score_grad, n, e_count, Device::kCuda);
    lb = g.lb_score_grad.data<float>(kOp);
  }
  launch_router_topk_backward(
      logits.data<float>(kOp), scores.data<float>(kOp), topk_index.data<int32_t>(kOp),
      topk_weight.data<float>(kOp), d_weight.data<float>(kOp), lb, group_tokens, g.lb_uses_softmax,
      g.z_grad_scale, dlogits.data<float>(kOp), n, e_count, params_of(o), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_router_topk_backward");
}

void router_z_loss(ConstTensorView logits, TensorView z_loss) {
  constexpr const char* kOp = "router_z_loss";
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "z_loss", z_loss);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [N, E], got rank {}", kOp, logits.rank());
  const int64_t n = logits.size(0), e_count = logits.size(1);
  expect_shape(kOp, "logits", logits, {n, e_count}, Device::kCuda);
  expect_shape(kOp, "z_loss", z_loss, {1}, Device::kCuda);
  double* mean = z_loss.data<double>(kOp);
  if (n == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(mean, 0, sizeof(double), stream()));
    return;
  }
  const StreamScratch row_values(sizeof(double) * static_cast<size_t>(n), stream());
  launch_router_z_loss(logits.data<float>(kOp), n, e_count, row_values.as<double>(), mean,
                       stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_router_z_loss");
}

void router_probability_column_sums(ConstTensorView logits, ConstTensorView scores,
                                    RouterProbability probability, TensorView column_sums) {
  constexpr const char* kOp = "router_probability_column_sums";
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "scores", scores);
  expect_on_device(kOp, "column_sums", column_sums);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [N, E], got rank {}", kOp, logits.rank());
  const int64_t n = logits.size(0), e_count = logits.size(1);
  expect_shape(kOp, "logits", logits, {n, e_count}, Device::kCuda);
  expect_shape(kOp, "scores", scores, {n, e_count}, Device::kCuda);
  const int64_t groups = token_groups(kOp, "column_sums", column_sums, n, e_count, Device::kCuda);
  const float* zp = logits.data<float>(kOp);
  const float* pp = scores.data<float>(kOp);
  const RouterColumnValue value = column_value_of(probability);
  double* sums = column_sums.data<double>(kOp);
  const size_t sum_bytes = sizeof(double) * static_cast<size_t>(e_count);
  if (n == 0 || e_count == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(sums, 0, sum_bytes * static_cast<size_t>(groups), stream()));
    return;
  }
  // Every group in one launch, each summed as a call for its tokens alone would sum them.
  MOE_CHECK(groups <= kMaxTokenGroups,
            "[{}] {} groups of tokens are more than the {} one launch takes", kOp, groups,
            kMaxTokenGroups);
  const StreamScratch scratch(
      static_cast<size_t>(router_column_sums_scratch_bytes(n, e_count, groups)), stream());
  launch_router_probability_column_sums(zp, pp, value, n, e_count, groups, scratch.as<void>(),
                                        stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_router_probability_column_sums");
  MOE_CUDA_CHECK(cudaMemcpyAsync(sums, scratch.as<void>(), sum_bytes * static_cast<size_t>(groups),
                                 cudaMemcpyDeviceToDevice, stream()));
}

void route_counts_by_group(ConstTensorView topk_index, TensorView counts) {
  constexpr const char* kOp = "route_counts_by_group";
  expect_on_device(kOp, "topk_index", topk_index);
  expect_on_device(kOp, "counts", counts);
  const GroupCountDims d = group_count_dims(kOp, topk_index, counts, Device::kCuda);
  MOE_CHECK(d.groups <= kMaxTokenGroups,
            "[{}] {} groups of tokens are more than the {} one launch takes", kOp, d.groups,
            kMaxTokenGroups);
  int64_t* out = counts.data<int64_t>(kOp);
  // The counts stay on the device (no wait for the routing): zeroed, then each group's routes
  // counted into its row.
  MOE_CUDA_CHECK(cudaMemsetAsync(
      out, 0, sizeof(int64_t) * static_cast<size_t>(d.groups * d.experts), stream()));
  if (d.tokens == 0) return;
  launch_route_counts(topk_index.data<int32_t>(kOp), d.tokens * d.top_k, d.experts, d.groups, out,
                      stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_route_counts");
}

}  // namespace moecore::kernels::cuda
