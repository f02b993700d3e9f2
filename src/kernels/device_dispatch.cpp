// kernels/ops.h's operations: each looks at the devices of its views and passes the call, as it
// is, to the backend of that memory (kernels/device_backends.h).
#include <array>
#include <atomic>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "kernels/cpu/ops.h"
#include "kernels/device_backends.h"

namespace moecore::kernels {

namespace {

std::array<std::atomic<const KernelBackend*>, kDeviceCount>& registered_backends() {
  static std::array<std::atomic<const KernelBackend*>, kDeviceCount> backends{};
  return backends;
}

// The one device of an operation's views (those with elements; a default view, an absent
// operand, has a null pointer); host memory when none has any.
Device device_of(const char* op, std::initializer_list<ConstTensorView> views) {
  bool found = false;
  Device device = Device::kCpu;
  for (const ConstTensorView& v : views) {
    if (v.raw() == nullptr || v.numel() == 0) continue;
    if (found && v.device() != device)
      fail(
          "[{}] its views are in {} and in {} memory: one operation's views are all in one "
          "device's memory",
          op, device_name(device), device_name(v.device()));
    device = v.device();
    found = true;
  }
  return device;
}

// Runs `op` with the CPU backend's `cpu_op` for host views, else with `entry` of the table
// registered for the views' device.
template <typename Fn, typename... Args>
decltype(auto) run_on_device(const char* op, Fn cpu_op, Fn KernelBackend::*entry,
                             std::initializer_list<ConstTensorView> views, Args&&... args) {
  const Device device = device_of(op, views);
  if (device == Device::kCpu) return cpu_op(std::forward<Args>(args)...);
  const KernelBackend* backend = device_backend(device);
  if (backend == nullptr)
    fail(
        "[{}] its views are in {} memory, but no {} backend is active (this build has none, or "
        "the process did not select that device)",
        op, device_name(device), device_name(device));
  const Fn device_op = backend->*entry;
  if (device_op == nullptr) fail("[{}] is not implemented on the {} backend", op, backend->name);
  return device_op(std::forward<Args>(args)...);
}

}  // namespace

void register_device_backend(Device device, const KernelBackend* backend) {
  MOE_CHECK(device != Device::kCpu,
            "[kernels] host memory is the CPU backend's; register a table for a device");
  registered_backends()[static_cast<size_t>(device)].store(backend, std::memory_order_release);
}

const KernelBackend* device_backend(Device device) {
  if (device == Device::kCpu) return &cpu_backend();
  return registered_backends()[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, MatmulPrecision precision) {
  return run_on_device("matmul", &cpu::matmul, &KernelBackend::matmul, {a, b, c}, a, trans_a, b,
                       trans_b, alpha, beta, c, precision);
}

void rmsnorm_forward(ConstTensorView x, ConstTensorView w, TensorView y, TensorView rstd,
                     float eps) {
  return run_on_device("rmsnorm_forward", &cpu::rmsnorm_forward, &KernelBackend::rmsnorm_forward,
                       {x, w, y, rstd}, x, w, y, rstd, eps);
}

void rmsnorm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                      ConstTensorView rstd, TensorView dx, TensorView dw, bool accumulate_dx) {
  return run_on_device("rmsnorm_backward", &cpu::rmsnorm_backward, &KernelBackend::rmsnorm_backward,
                       {dy, x, w, rstd, dx, dw}, dy, x, w, rstd, dx, dw, accumulate_dx);
}

void swiglu_forward(ConstTensorView gu, TensorView act) {
  return run_on_device("swiglu_forward", &cpu::swiglu_forward, &KernelBackend::swiglu_forward,
                       {gu, act}, gu, act);
}

void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  return run_on_device("swiglu_backward", &cpu::swiglu_backward, &KernelBackend::swiglu_backward,
                       {dact, gu, dgu}, dact, gu, dgu);
}

void embedding_forward(ConstTensorView tokens, ConstTensorView w, TensorView out) {
  return run_on_device("embedding_forward", &cpu::embedding_forward,
                       &KernelBackend::embedding_forward, {tokens, w, out}, tokens, w, out);
}

void embedding_backward(ConstTensorView tokens, ConstTensorView dout, TensorView dw,
                        int64_t padding_idx) {
  return run_on_device("embedding_backward", &cpu::embedding_backward,
                       &KernelBackend::embedding_backward, {tokens, dout, dw}, tokens, dout, dw,
                       padding_idx);
}

void rope_forward(TensorView x, ConstTensorView cos, ConstTensorView sin, int64_t first_position) {
  return run_on_device("rope_forward", &cpu::rope_forward, &KernelBackend::rope_forward,
                       {x, cos, sin}, x, cos, sin, first_position);
}

void rope_backward(TensorView dx, ConstTensorView cos, ConstTensorView sin,
                   int64_t first_position) {
  return run_on_device("rope_backward", &cpu::rope_backward, &KernelBackend::rope_backward,
                       {dx, cos, sin}, dx, cos, sin, first_position);
}

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   float z_loss_coef, ConstTensorView normalizer, TensorView losses) {
  return run_on_device("cross_entropy", &cpu::cross_entropy, &KernelBackend::cross_entropy,
                       {logits, targets, dlogits, normalizer, losses}, logits, targets, dlogits,
                       scale, z_loss_coef, normalizer, losses);
}

void adamw_update(TensorView params, ConstTensorView grads, TensorView exp_avg,
                  TensorView exp_avg_sq, const AdamWCoefficients& coefficients,
                  ConstTensorView step_coefficients, ConstTensorView step_factors) {
  return run_on_device("adamw_update", &cpu::adamw_update, &KernelBackend::adamw_update,
                       {params, grads, exp_avg, exp_avg_sq, step_coefficients, step_factors},
                       params, grads, exp_avg, exp_avg_sq, coefficients, step_coefficients,
                       step_factors);
}

void step_decision(ConstTensorView loss_rows, ConstTensorView squares,
                   const StepDecisionOptions& options, ConstTensorView limits, TensorView decision,
                   TensorView step_factors) {
  return run_on_device("step_decision", &cpu::step_decision, &KernelBackend::step_decision,
                       {loss_rows, squares, limits, decision, step_factors}, loss_rows, squares,
                       options, limits, decision, step_factors);
}

void sum_of_squares(ConstTensorView values, TensorView total) {
  return run_on_device("sum_of_squares", &cpu::sum_of_squares, &KernelBackend::sum_of_squares,
                       {values, total}, values, total);
}

void causal_attention_forward(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                              TensorView out, TensorView probs, ConstTensorView doc_start,
                              MatmulPrecision precision) {
  return run_on_device("causal_attention_forward", &cpu::causal_attention_forward,
                       &KernelBackend::causal_attention_forward, {q, k, v, out, probs, doc_start},
                       q, k, v, out, probs, doc_start, precision);
}

void causal_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                               ConstTensorView v, ConstTensorView probs, TensorView dq,
                               TensorView dk, TensorView dv, MatmulPrecision precision) {
  return run_on_device("causal_attention_backward", &cpu::causal_attention_backward,
                       &KernelBackend::causal_attention_backward,
                       {dout, q, k, v, probs, dq, dk, dv}, dout, q, k, v, probs, dq, dk, dv,
                       precision);
}

void flash_attention_forward(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                             TensorView out, TensorView lse, ConstTensorView doc_start,
                             MatmulPrecision precision) {
  return run_on_device("flash_attention_forward", &cpu::flash_attention_forward,
                       &KernelBackend::flash_attention_forward, {q, k, v, out, lse, doc_start}, q,
                       k, v, out, lse, doc_start, precision);
}

void flash_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                              ConstTensorView doc_start, TensorView dq, TensorView dk,
                              TensorView dv, MatmulPrecision precision) {
  return run_on_device("flash_attention_backward", &cpu::flash_attention_backward,
                       &KernelBackend::flash_attention_backward,
                       {dout, q, k, v, out, lse, doc_start, dq, dk, dv}, dout, q, k, v, out, lse,
                       doc_start, dq, dk, dv, precision);
}

void permute_rows(ConstTensorView src, ConstTensorView dst_row, int64_t routes_per_row,
                  TensorView dst) {
  return run_on_device("permute_rows", &cpu::permute_rows, &KernelBackend::permute_rows,
                       {src, dst_row, dst}, src, dst_row, routes_per_row, dst);
}

void permute_rows_backward(ConstTensorView d_dst, ConstTensorView dst_row, int64_t routes_per_row,
                           TensorView d_src) {
  return run_on_device("permute_rows_backward", &cpu::permute_rows_backward,
                       &KernelBackend::permute_rows_backward, {d_dst, dst_row, d_src}, d_dst,
                       dst_row, routes_per_row, d_src);
}

void gather_rows(ConstTensorView src, ConstTensorView src_row, TensorView dst) {
  return run_on_device("gather_rows", &cpu::gather_rows, &KernelBackend::gather_rows,
                       {src, src_row, dst}, src, src_row, dst);
}

void moe_combine_forward(ConstTensorView routed, ConstTensorView route_row, ConstTensorView weights,
                         TensorView y) {
  return run_on_device("moe_combine_forward", &cpu::moe_combine_forward,
                       &KernelBackend::moe_combine_forward, {routed, route_row, weights, y}, routed,
                       route_row, weights, y);
}

void moe_combine_backward(ConstTensorView dy, ConstTensorView routed, ConstTensorView route_row,
                          ConstTensorView weights, TensorView d_routed, TensorView d_weights) {
  return run_on_device("moe_combine_backward", &cpu::moe_combine_backward,
                       &KernelBackend::moe_combine_backward,
                       {dy, routed, route_row, weights, d_routed, d_weights}, dy, routed, route_row,
                       weights, d_routed, d_weights);
}

void order_routes_by_expert(ConstTensorView topk_index, int64_t experts, TensorView dst_row,
                            TensorView expert_offsets) {
  return run_on_device("order_routes_by_expert", &cpu::order_routes_by_expert,
                       &KernelBackend::order_routes_by_expert,
                       {topk_index, dst_row, expert_offsets}, topk_index, experts, dst_row,
                       expert_offsets);
}

void padded_dispatch_plan(ConstTensorView requests, ConstTensorView topk_index,
                          ConstTensorView route_order, ConstTensorView expert_starts,
                          const PaddedDispatchShape& shape, const PaddedDispatchMaps& maps) {
  return run_on_device("padded_dispatch_plan", &cpu::padded_dispatch_plan,
                       &KernelBackend::padded_dispatch_plan,
                       {requests, topk_index, route_order, expert_starts, maps.slot_of_position,
                        maps.position_of_slot, maps.token_of_slot, maps.row_of_slot,
                        maps.slot_of_row, maps.expert_offsets, maps.dropped},
                       requests, topk_index, route_order, expert_starts, shape, maps);
}

void router_topk_forward(ConstTensorView logits, ConstTensorView selection_bias,
                         const RouterTopkOptions& options, TensorView scores, TensorView topk_index,
                         TensorView topk_weight, TensorView expert_counts) {
  return run_on_device(
      "router_topk_forward", &cpu::router_topk_forward, &KernelBackend::router_topk_forward,
      {logits, selection_bias, scores, topk_index, topk_weight, expert_counts}, logits,
      selection_bias, options, scores, topk_index, topk_weight, expert_counts);
}

void router_topk_backward(ConstTensorView logits, ConstTensorView scores,
                          ConstTensorView topk_index, ConstTensorView topk_weight,
                          ConstTensorView d_weight, const RouterLossGrads& loss_grads,
                          const RouterTopkOptions& options, TensorView dlogits) {
  return run_on_device(
      "router_topk_backward", &cpu::router_topk_backward, &KernelBackend::router_topk_backward,
      {logits, scores, topk_index, topk_weight, d_weight, loss_grads.lb_score_grad, dlogits},
      logits, scores, topk_index, topk_weight, d_weight, loss_grads, options, dlogits);
}

void router_z_loss(ConstTensorView logits, TensorView z_loss) {
  return run_on_device("router_z_loss", &cpu::router_z_loss, &KernelBackend::router_z_loss,
                       {logits, z_loss}, logits, z_loss);
}

void router_probability_column_sums(ConstTensorView logits, ConstTensorView scores,
                                    RouterProbability probability, TensorView column_sums) {
  return run_on_device("router_probability_column_sums", &cpu::router_probability_column_sums,
                       &KernelBackend::router_probability_column_sums,
                       {logits, scores, column_sums}, logits, scores, probability, column_sums);
}

void route_counts_by_group(ConstTensorView topk_index, TensorView counts) {
  return run_on_device("route_counts_by_group", &cpu::route_counts_by_group,
                       &KernelBackend::route_counts_by_group, {topk_index, counts}, topk_index,
                       counts);
}

void moe_loss_terms(ConstTensorView route_counts, ConstTensorView router_sums,
                    ConstTensorView head_losses, const MoeLossOptions& options, TensorView losses,
                    TensorView lb_score_grad, TensorView route_tally) {
  return run_on_device("moe_loss_terms", &cpu::moe_loss_terms, &KernelBackend::moe_loss_terms,
                       {route_counts, router_sums, head_losses, losses, lb_score_grad, route_tally},
                       route_counts, router_sums, head_losses, options, losses, lb_score_grad,
                       route_tally);
}

void router_bias_update(ConstTensorView counts, float rate, ConstTensorView step_factors,
                        TensorView bias) {
  return run_on_device("router_bias_update", &cpu::router_bias_update,
                       &KernelBackend::router_bias_update, {counts, step_factors, bias}, counts,
                       rate, step_factors, bias);
}

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w, ConstTensorView expert_offsets,
                          TensorView y, MatmulPrecision precision) {
  return run_on_device("grouped_gemm_forward", &cpu::grouped_gemm_forward,
                       &KernelBackend::grouped_gemm_forward, {x, w, expert_offsets, y}, x, w,
                       expert_offsets, y, precision);
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  return run_on_device("grouped_gemm_backward", &cpu::grouped_gemm_backward,
                       &KernelBackend::grouped_gemm_backward, {dy, x, w, expert_offsets, dx, dw},
                       dy, x, w, expert_offsets, dx, dw, precision);
}

void to_bf16(ConstTensorView src, TensorView dst) {
  return run_on_device("to_bf16", &cpu::to_bf16, &KernelBackend::to_bf16, {src, dst}, src, dst);
}

void add(ConstTensorView a, ConstTensorView b, TensorView out) {
  return run_on_device("add", &cpu::add, &KernelBackend::add, {a, b, out}, a, b, out);
}

void scale(ConstTensorView x, float factor, TensorView out) {
  return run_on_device("scale", &cpu::scale, &KernelBackend::scale, {x, out}, x, factor, out);
}

void cached_attention_forward(ConstTensorView q, ConstTensorView k_cache, ConstTensorView v_cache,
                              int64_t first_position, TensorView out) {
  return run_on_device("cached_attention_forward", &cpu::cached_attention_forward,
                       &KernelBackend::cached_attention_forward, {q, k_cache, v_cache, out}, q,
                       k_cache, v_cache, first_position, out);
}

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  return run_on_device("mx_quantize", &cpu::mx_quantize, &KernelBackend::mx_quantize,
                       {x, codes, scales}, x, mode, codes, scales);
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  return run_on_device("mx_quantize_transposed", &cpu::mx_quantize_transposed,
                       &KernelBackend::mx_quantize_transposed, {x, codes, scales}, x, mode, codes,
                       scales);
}

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  return run_on_device("mx_dequantize", &cpu::mx_dequantize, &KernelBackend::mx_dequantize,
                       {quantized.codes, quantized.scales, x}, quantized, x);
}

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  return run_on_device("mx_matmul", &cpu::mx_matmul, &KernelBackend::mx_matmul,
                       {a.codes, a.scales, b.codes, b.scales, c}, a, b, alpha, beta, c);
}

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             ConstTensorView expert_offsets, TensorView y) {
  return run_on_device("mx_grouped_gemm_forward", &cpu::mx_grouped_gemm_forward,
                       &KernelBackend::mx_grouped_gemm_forward,
                       {x.codes, x.scales, w.codes, w.scales, expert_offsets, y}, x, w,
                       expert_offsets, y);
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    ConstTensorView expert_offsets, TensorView dx) {
  return run_on_device(
      "mx_grouped_gemm_backward_input", &cpu::mx_grouped_gemm_backward_input,
      &KernelBackend::mx_grouped_gemm_backward_input,
      {dy.codes, dy.scales, w_transposed.codes, w_transposed.scales, expert_offsets, dx}, dy,
      w_transposed, expert_offsets, dx);
}

}  // namespace moecore::kernels
