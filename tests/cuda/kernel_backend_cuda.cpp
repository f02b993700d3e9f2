// The CUDA backend joins the per-op harness (tests/cpp/kernel_harness.h) through host-staged
// wrappers: each copies the harness's host views to the device (device_staging.h), runs the
// CUDA operation on them and copies the outputs back. The harness then runs every case of
// test_kernel_ops.cpp and test_kernel_ops_mx.cpp against the CUDA kernels and the plain-loop
// oracle; operations the CUDA backend does not have yet stay null and their cases skip.
#include <span>

#include "device_staging.h"
#include "kernel_harness.h"
#include "kernels/cuda/ops.h"

namespace moecore::cuda_test {
namespace {

const kernels::KernelBackend& device() {
  return kernels::cuda_backend();
}

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, kernels::MatmulPrecision precision) {
  DeviceStaging s;
  device().matmul(s.in(a), trans_a, s.in(b), trans_b, alpha, beta, s.out(c), precision);
  s.finish();
}

void rmsnorm_forward(ConstTensorView x, ConstTensorView w, TensorView y, TensorView rstd,
                     float eps) {
  DeviceStaging s;
  device().rmsnorm_forward(s.in(x), s.in(w), s.out(y), s.out(rstd), eps);
  s.finish();
}

void rmsnorm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                      ConstTensorView rstd, TensorView dx, TensorView dw, bool accumulate_dx) {
  DeviceStaging s;
  device().rmsnorm_backward(s.in(dy), s.in(x), s.in(w), s.in(rstd), s.out(dx), s.out(dw),
                            accumulate_dx);
  s.finish();
}

void swiglu_forward(ConstTensorView gu, TensorView act) {
  DeviceStaging s;
  device().swiglu_forward(s.in(gu), s.out(act));
  s.finish();
}

void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  DeviceStaging s;
  device().swiglu_backward(s.in(dact), s.in(gu), s.out(dgu));
  s.finish();
}

void embedding_forward(ConstTensorView tokens, ConstTensorView w, TensorView out) {
  DeviceStaging s;
  device().embedding_forward(s.in(tokens), s.in(w), s.out(out));
  s.finish();
}

void embedding_backward(ConstTensorView tokens, ConstTensorView dout, TensorView dw,
                        int64_t padding_idx) {
  DeviceStaging s;
  device().embedding_backward(s.in(tokens), s.in(dout), s.out(dw), padding_idx);
  s.finish();
}

void rope_forward(TensorView x, ConstTensorView cos, ConstTensorView sin, int64_t first_position) {
  DeviceStaging s;
  device().rope_forward(s.out(x), s.in(cos), s.in(sin), first_position);
  s.finish();
}

void rope_backward(TensorView dx, ConstTensorView cos, ConstTensorView sin,
                   int64_t first_position) {
  DeviceStaging s;
  device().rope_backward(s.out(dx), s.in(cos), s.in(sin), first_position);
  s.finish();
}

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   float z_loss_coef, ConstTensorView normalizer, TensorView losses) {
  DeviceStaging s;
  device().cross_entropy(s.in(logits), s.in(targets), s.out(dlogits), scale, z_loss_coef,
                         s.in(normalizer), s.out(losses));
  s.finish();
}

void adamw_update(TensorView params, ConstTensorView grads, TensorView exp_avg,
                  TensorView exp_avg_sq, const AdamWCoefficients& coefficients,
                  ConstTensorView step_coefficients, ConstTensorView step_factors) {
  DeviceStaging s;
  device().adamw_update(s.out(params), s.in(grads), s.out(exp_avg), s.out(exp_avg_sq), coefficients,
                        s.in(step_coefficients), s.in(step_factors));
  s.finish();
}

void step_decision(ConstTensorView loss_rows, ConstTensorView squares,
                   const StepDecisionOptions& options, ConstTensorView limits, TensorView decision,
                   TensorView step_factors) {
  DeviceStaging s;
  device().step_decision(s.in(loss_rows), s.in(squares), options, s.in(limits), s.out(decision),
                         s.out(step_factors));
  s.finish();
}

void sum_of_squares(ConstTensorView values, TensorView total) {
  DeviceStaging s;
  device().sum_of_squares(s.in(values), s.out(total));
  s.finish();
}

void flash_attention_forward(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                             TensorView out, TensorView lse, ConstTensorView doc_start,
                             kernels::MatmulPrecision precision) {
  DeviceStaging s;
  device().flash_attention_forward(s.in(q), s.in(k), s.in(v), s.out(out), s.out(lse),
                                   s.in(doc_start), precision);
  s.finish();
}

void flash_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                              ConstTensorView doc_start, TensorView dq, TensorView dk,
                              TensorView dv, kernels::MatmulPrecision precision) {
  DeviceStaging s;
  device().flash_attention_backward(s.in(dout), s.in(q), s.in(k), s.in(v), s.in(out), s.in(lse),
                                    s.in(doc_start), s.out(dq), s.out(dk), s.out(dv), precision);
  s.finish();
}

void permute_rows(ConstTensorView src, ConstTensorView dst_row, int64_t routes_per_row,
                  TensorView dst) {
  DeviceStaging s;
  device().permute_rows(s.in(src), s.in(dst_row), routes_per_row, s.out(dst));
  s.finish();
}

void permute_rows_backward(ConstTensorView d_dst, ConstTensorView dst_row, int64_t routes_per_row,
                           TensorView d_src) {
  DeviceStaging s;
  device().permute_rows_backward(s.in(d_dst), s.in(dst_row), routes_per_row, s.out(d_src));
  s.finish();
}

void gather_rows(ConstTensorView src, ConstTensorView src_row, TensorView dst) {
  DeviceStaging s;
  device().gather_rows(s.in(src), s.in(src_row), s.out(dst));
  s.finish();
}

void moe_combine_forward(ConstTensorView routed, ConstTensorView route_row, ConstTensorView weights,
                         TensorView y) {
  DeviceStaging s;
  device().moe_combine_forward(s.in(routed), s.in(route_row), s.in(weights), s.out(y));
  s.finish();
}

void moe_combine_backward(ConstTensorView dy, ConstTensorView routed, ConstTensorView route_row,
                          ConstTensorView weights, TensorView d_routed, TensorView d_weights) {
  DeviceStaging s;
  device().moe_combine_backward(s.in(dy), s.in(routed), s.in(route_row), s.in(weights),
                                s.out(d_routed), s.out(d_weights));
  s.finish();
}

void order_routes_by_expert(ConstTensorView topk_index, int64_t experts, TensorView dst_row,
                            TensorView expert_offsets) {
  DeviceStaging s;
  device().order_routes_by_expert(s.in(topk_index), experts, s.out(dst_row), s.out(expert_offsets));
  s.finish();
}

void padded_dispatch_plan(ConstTensorView requests, ConstTensorView topk_index,
                          ConstTensorView route_order, ConstTensorView expert_starts,
                          const PaddedDispatchShape& shape, const PaddedDispatchMaps& maps) {
  DeviceStaging s;
  device().padded_dispatch_plan(
      s.in(requests), s.in(topk_index), s.in(route_order), s.in(expert_starts), shape,
      {s.out(maps.slot_of_position), s.out(maps.position_of_slot), s.out(maps.token_of_slot),
       s.out(maps.row_of_slot), s.out(maps.slot_of_row), s.out(maps.expert_offsets),
       s.out(maps.dropped)});
  s.finish();
}

void router_topk_forward(ConstTensorView logits, ConstTensorView selection_bias,
                         const RouterTopkOptions& options, TensorView scores, TensorView topk_index,
                         TensorView topk_weight, TensorView expert_counts) {
  DeviceStaging s;
  device().router_topk_forward(s.in(logits), s.in(selection_bias), options, s.out(scores),
                               s.out(topk_index), s.out(topk_weight), s.out(expert_counts));
  s.finish();
}

void router_topk_backward(ConstTensorView logits, ConstTensorView scores,
                          ConstTensorView topk_index, ConstTensorView topk_weight,
                          ConstTensorView d_weight, const RouterLossGrads& loss_grads,
                          const RouterTopkOptions& options, TensorView dlogits) {
  DeviceStaging s;
  RouterLossGrads staged = loss_grads;
  staged.lb_score_grad = s.in(loss_grads.lb_score_grad);
  device().router_topk_backward(s.in(logits), s.in(scores), s.in(topk_index), s.in(topk_weight),
                                s.in(d_weight), staged, options, s.out(dlogits));
  s.finish();
}

void router_z_loss(ConstTensorView logits, TensorView z_loss) {
  DeviceStaging s;
  device().router_z_loss(s.in(logits), s.out(z_loss));
  s.finish();
}

void router_probability_column_sums(ConstTensorView logits, ConstTensorView scores,
                                    RouterProbability probability, TensorView column_sums) {
  DeviceStaging s;
  device().router_probability_column_sums(s.in(logits), s.in(scores), probability,
                                          s.out(column_sums));
  s.finish();
}

void route_counts_by_group(ConstTensorView topk_index, TensorView counts) {
  DeviceStaging s;
  device().route_counts_by_group(s.in(topk_index), s.out(counts));
  s.finish();
}

void moe_loss_terms(ConstTensorView route_counts, ConstTensorView router_sums,
                    ConstTensorView head_losses, const MoeLossOptions& options, TensorView losses,
                    TensorView lb_score_grad, TensorView route_tally) {
  DeviceStaging s;
  device().moe_loss_terms(s.in(route_counts), s.in(router_sums), s.in(head_losses), options,
                          s.out(losses), s.out(lb_score_grad), s.out(route_tally));
  s.finish();
}

void router_bias_update(ConstTensorView counts, float rate, ConstTensorView step_factors,
                        TensorView bias) {
  DeviceStaging s;
  device().router_bias_update(s.in(counts), rate, s.in(step_factors), s.out(bias));
  s.finish();
}

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w, ConstTensorView expert_offsets,
                          TensorView y, kernels::MatmulPrecision precision) {
  DeviceStaging s;
  device().grouped_gemm_forward(s.in(x), s.in(w), s.in(expert_offsets), s.out(y), precision);
  s.finish();
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           kernels::MatmulPrecision precision) {
  DeviceStaging s;
  device().grouped_gemm_backward(s.in(dy), s.in(x), s.in(w), s.in(expert_offsets), s.out(dx),
                                 s.out(dw), precision);
  s.finish();
}

void add(ConstTensorView a, ConstTensorView b, TensorView out) {
  DeviceStaging s;
  device().add(s.in(a), s.in(b), s.out(out));
  s.finish();
}

void scale(ConstTensorView x, float factor, TensorView out) {
  DeviceStaging s;
  device().scale(s.in(x), factor, s.out(out));
  s.finish();
}

void cached_attention_forward(ConstTensorView q, ConstTensorView k_cache, ConstTensorView v_cache,
                              int64_t first_position, TensorView out) {
  DeviceStaging s;
  device().cached_attention_forward(s.in(q), s.in(k_cache), s.in(v_cache), first_position,
                                    s.out(out));
  s.finish();
}

void to_bf16(ConstTensorView src, TensorView dst) {
  DeviceStaging s;
  device().to_bf16(s.in(src), s.out(dst));
  s.finish();
}

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  DeviceStaging s;
  device().mx_quantize(s.in(x), mode, s.out(codes), s.out(scales));
  s.finish();
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  DeviceStaging s;
  device().mx_quantize_transposed(s.in(x), mode, s.out(codes), s.out(scales));
  s.finish();
}

// An MX operand's two views, codes and scales, both staged in.
MxOperandView staged(DeviceStaging& s, const MxOperandView& v) {
  return {s.in(v.codes), s.in(v.scales)};
}

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  DeviceStaging s;
  device().mx_dequantize(staged(s, quantized), s.out(x));
  s.finish();
}

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  DeviceStaging s;
  device().mx_matmul(staged(s, a), staged(s, b), alpha, beta, s.out(c));
  s.finish();
}

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             ConstTensorView expert_offsets, TensorView y) {
  DeviceStaging s;
  device().mx_grouped_gemm_forward(staged(s, x), staged(s, w), s.in(expert_offsets), s.out(y));
  s.finish();
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    ConstTensorView expert_offsets, TensorView dx) {
  DeviceStaging s;
  device().mx_grouped_gemm_backward_input(staged(s, dy), staged(s, w_transposed),
                                          s.in(expert_offsets), s.out(dx));
  s.finish();
}

// The staged table: an entry wherever the device table has one.
template <typename F>
F if_on_device(F device_op, F staged) {
  return device_op != nullptr ? staged : nullptr;
}

const kernels::KernelBackend& staged_cuda_backend() {
  const kernels::KernelBackend& d = device();
  static const kernels::KernelBackend backend{
      .name = "cuda",
      .mx_gemm_bit_exact = d.mx_gemm_bit_exact,
      .matmul = if_on_device(d.matmul, &matmul),
      .rmsnorm_forward = if_on_device(d.rmsnorm_forward, &rmsnorm_forward),
      .rmsnorm_backward = if_on_device(d.rmsnorm_backward, &rmsnorm_backward),
      .swiglu_forward = if_on_device(d.swiglu_forward, &swiglu_forward),
      .swiglu_backward = if_on_device(d.swiglu_backward, &swiglu_backward),
      .embedding_forward = if_on_device(d.embedding_forward, &embedding_forward),
      .embedding_backward = if_on_device(d.embedding_backward, &embedding_backward),
      .rope_forward = if_on_device(d.rope_forward, &rope_forward),
      .rope_backward = if_on_device(d.rope_backward, &rope_backward),
      .cross_entropy = if_on_device(d.cross_entropy, &cross_entropy),
      .adamw_update = if_on_device(d.adamw_update, &adamw_update),
      .step_decision = if_on_device(d.step_decision, &step_decision),
      .sum_of_squares = if_on_device(d.sum_of_squares, &sum_of_squares),
      .causal_attention_forward = nullptr,
      .causal_attention_backward = nullptr,
      .flash_attention_forward = if_on_device(d.flash_attention_forward, &flash_attention_forward),
      .flash_attention_backward =
          if_on_device(d.flash_attention_backward, &flash_attention_backward),
      .permute_rows = if_on_device(d.permute_rows, &permute_rows),
      .permute_rows_backward = if_on_device(d.permute_rows_backward, &permute_rows_backward),
      .gather_rows = if_on_device(d.gather_rows, &gather_rows),
      .moe_combine_forward = if_on_device(d.moe_combine_forward, &moe_combine_forward),
      .moe_combine_backward = if_on_device(d.moe_combine_backward, &moe_combine_backward),
      .order_routes_by_expert = if_on_device(d.order_routes_by_expert, &order_routes_by_expert),
      .padded_dispatch_plan = if_on_device(d.padded_dispatch_plan, &padded_dispatch_plan),
      .router_topk_forward = if_on_device(d.router_topk_forward, &router_topk_forward),
      .router_topk_backward = if_on_device(d.router_topk_backward, &router_topk_backward),
      .router_z_loss = if_on_device(d.router_z_loss, &router_z_loss),
      .router_probability_column_sums =
          if_on_device(d.router_probability_column_sums, &router_probability_column_sums),
      .route_counts_by_group = if_on_device(d.route_counts_by_group, &route_counts_by_group),
      .moe_loss_terms = if_on_device(d.moe_loss_terms, &moe_loss_terms),
      .router_bias_update = if_on_device(d.router_bias_update, &router_bias_update),
      .grouped_gemm_forward = if_on_device(d.grouped_gemm_forward, &grouped_gemm_forward),
      .grouped_gemm_backward = if_on_device(d.grouped_gemm_backward, &grouped_gemm_backward),
      .add = if_on_device(d.add, &add),
      .scale = if_on_device(d.scale, &scale),
      .cached_attention_forward =
          if_on_device(d.cached_attention_forward, &cached_attention_forward),
      .to_bf16 = if_on_device(d.to_bf16, &to_bf16),
      .mx_quantize = if_on_device(d.mx_quantize, &mx_quantize),
      .mx_quantize_transposed = if_on_device(d.mx_quantize_transposed, &mx_quantize_transposed),
      .mx_dequantize = if_on_device(d.mx_dequantize, &mx_dequantize),
      .mx_matmul = if_on_device(d.mx_matmul, &mx_matmul),
      .mx_grouped_gemm_forward = if_on_device(d.mx_grouped_gemm_forward, &mx_grouped_gemm_forward),
      .mx_grouped_gemm_backward_input =
          if_on_device(d.mx_grouped_gemm_backward_input, &mx_grouped_gemm_backward_input),
  };
  return backend;
}

const kernel_harness::BackendRegistration kCudaRegistration{staged_cuda_backend()};

}  // namespace
}  // namespace moecore::cuda_test
