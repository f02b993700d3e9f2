// The launchers of the CUDA backend's kernels (*.cu, compiled by nvcc): raw device pointers,
// extents and the stream, no views and no checks (the operations in *.cpp check their views and
// call these). Each launcher issues its kernels on `stream` and returns.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/moe_loss_rules.h"
#include "kernels/padded_dispatch_shape.h"
#include "kernels/step_decision_rules.h"

namespace moecore::kernels::cuda {

// index_checks.cu: an index outside its tensor, as the device records it for the host
// (index_checks.h). op and name are the addresses of string literals, op 0 while none is pending.
struct IndexErrorRecord {
  unsigned long long op;
  unsigned long long name;
  long long position;
  long long lowest;
  long long limit;
  int value;
};
// Finds the first i < count with indices[i] outside [lowest, limit) (first_bad: one int64 of
// device scratch) and, unless *record already holds an error, records it there (op and name given
// as above); nothing when every index is inside.
void launch_record_first_index_outside(const int32_t* indices, int64_t count, int64_t lowest,
                                       int64_t limit, int64_t* first_bad, IndexErrorRecord* record,
                                       unsigned long long op, unsigned long long name,
                                       cudaStream_t stream);

// elementwise.cu: out = a + b; out = x * factor; dst (bf16 bits) = src rounded to nearest even.
void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
void launch_scale(const float* x, float factor, float* out, int64_t n, cudaStream_t stream);
void launch_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);

// rmsnorm.cu: y = x * rstd * w per row of [rows, dim] (rstd, fp32, saved per row); the backward
// writes dx (= or +=) and adds to dw through `scratch`, rmsnorm_backward_scratch_floats(rows, dim)
// floats (none when that is 0), so that dw's sums run in a fixed order.
void launch_rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                            int64_t dim, float eps, cudaStream_t stream);
int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t dim);
void launch_rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                             float* dx, float* dw, float* scratch, int64_t rows, int64_t dim,
                             bool accumulate_dx, cudaStream_t stream);

// swiglu.cu: act [rows, hidden] = silu(gate) * up of gu [rows, 2 hidden]; dgu (=) from dact.
// Out: float, or uint16_t for bf16 bits (rounded as core/bf16.h's float_to_bf16).
template <typename Out>
void launch_swiglu_forward(const float* gu, Out* act, int64_t rows, int64_t hidden,
                           cudaStream_t stream);
template <typename Out>
void launch_swiglu_backward(const float* dact, const float* gu, Out* dgu, int64_t rows,
                            int64_t hidden, cudaStream_t stream);

// rope.cu: rotates the (i, i + half) pairs of x [batch, seq, heads, 2 half] in place by the angles
// of cos, sin [seq, half] (the tables' rows from first_position on), or by their opposites when
// inverse (the backward).
void launch_rope(float* x, const float* cos, const float* sin, int64_t batch, int64_t seq,
                 int64_t heads, int64_t half, bool inverse, cudaStream_t stream);

// embedding.cu: out[r, :] = w[tokens[r], :]; dw[tokens[r], :] += dout[r, :] in row order. An id
// outside [0, vocab) gives a NaN row of out and adds nothing. The backward sorts the rows by
// token first, in `scratch` (embedding_backward_scratch_bytes(rows) bytes of device memory);
// rows < 2^31.
void launch_embedding_forward(const int32_t* tokens, const float* w, float* out, int64_t rows,
                              int64_t vocab, int64_t dim, cudaStream_t stream);
size_t embedding_backward_scratch_bytes(int64_t rows);
// Returns the first failure of its launches (CUB's sort reports its own). Rows of padding_idx
// (>= 0; -1: none) add nothing.
cudaError_t launch_embedding_backward(const int32_t* tokens, const float* dout, float* dw,
                                      int64_t rows, int64_t vocab, int64_t dim, int64_t padding_idx,
                                      void* scratch, cudaStream_t stream);

// adamw.cu: one AdamW update of n elements in the CPU's fp32 steps (AdamWCoefficients' fields,
// which kernels/ops.h holds and nvcc does not compile).
struct AdamWScalars {
  float decay_factor, b1, b2, bias2_sqrt, eps, step_size, grad_scale;
};
// step_coefficients: f32 [3], step_factors: f32 [2], each on the device or null (kernels/ops.h's
// adamw_update).
void launch_adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                         int64_t n, const AdamWScalars& scalars, const float* step_coefficients,
                         const float* step_factors, cudaStream_t stream);

// sum_of_squares.cu: *total (device) = sum of values[i]^2 in double; partials: scratch of
// kSumOfSquaresPartials doubles. Issues nothing when n is 0.
inline constexpr int64_t kSumOfSquaresPartials = 1024;
void launch_sum_of_squares(const float* values, int64_t n, double* partials, double* total,
                           cudaStream_t stream);

// padded_dispatch.cu: kernels/ops.h's padded_dispatch_plan; the keep matrix's device scratch
// (kernels/padded_dispatch_rules.h's padded_keep): kept and first_row [ranks * E], send_base [E],
// recv_base [ranks * (local + 1)].
struct PaddedDispatchScratch {
  int64_t *kept, *first_row, *send_base, *recv_base;
};
void launch_padded_dispatch_plan(const int64_t* requests, const int32_t* topk_index,
                                 const int32_t* route_order, const int64_t* expert_starts,
                                 int64_t tokens, int64_t top_k, const PaddedDispatchShape& shape,
                                 const PaddedDispatchScratch& scratch, int32_t* slot_of_position,
                                 int32_t* position_of_slot, int32_t* token_of_slot,
                                 int32_t* row_of_slot, int32_t* slot_of_row,
                                 int64_t* expert_offsets, int64_t* dropped, cudaStream_t stream);

// moe_losses.cu: kernels/ops.h's moe_loss_terms (kernels/moe_loss_rules.h; tally may be null;
// lb_shares: lb_row_count(layers, experts, scalars) doubles of scratch) and router_bias_update
// in one thread.
void launch_moe_loss_terms(const int64_t* route_counts, const double* router_sums,
                           const double* head_losses, int64_t layers, int64_t experts,
                           int64_t head_chunks, const MoeLossScalars& scalars, double* losses,
                           float* lb_score_grad, double* route_tally, double* lb_shares,
                           cudaStream_t stream);
void launch_router_bias_update(const double* counts, int64_t experts, float rate,
                               const float* step_factors, float* bias, cudaStream_t stream);

// step_decision.cu: kernels/ops.h's step_decision in one thread (kernels/step_decision_rules.h);
// limits: two doubles on the device, or null.
void launch_step_decision(const double* loss_rows, int64_t rows, const double* squares,
                          const StepDecisionScalars& scalars, const double* limits,
                          double* decision, float* step_factors, cudaStream_t stream);

// cross_entropy.cu: dlogits (= when not null) and losses ([kHeadLosses] doubles on the device) as
// kernels/ops.h's cross_entropy defines them, a target outside [0, vocab) counted as ignored;
// normalizer: one double on the device, or null (the rows' count); row_losses ([rows,
// kHeadLosses] doubles) and counted (one) are scratch.
void launch_cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t rows,
                          int64_t vocab, float scale, float z_loss_coef, const double* normalizer,
                          double* row_losses, long long* counted, double* losses,
                          cudaStream_t stream);

// permute_rows.cu: kernels/ops.h's permute_rows, permute_rows_backward and gather_rows. A route
// naming a row outside its tensor writes nothing and reads NaN (checking on the host would wait).
void launch_permute_rows(const float* src, const int32_t* dst_row, int64_t routes,
                         int64_t routes_per_row, int64_t d, float* dst, int64_t dst_rows,
                         cudaStream_t stream);
void launch_permute_rows_backward(const float* d_dst, int64_t dst_rows, const int32_t* dst_row,
                                  int64_t tokens, int64_t routes_per_row, int64_t d, float* d_src,
                                  cudaStream_t stream);
void launch_gather_rows(const float* src, int64_t src_rows, const int32_t* src_row, int64_t rows,
                        int64_t d, float* dst, cudaStream_t stream);

// moe_combine.cu: kernels/ops.h's moe_combine_forward and moe_combine_backward, route_row [tokens,
// k] naming rows of routed [routed_rows, d] (outside: as permute_rows.cu).
void launch_moe_combine_forward(const float* routed, int64_t routed_rows, const int32_t* route_row,
                                const float* weights, int64_t tokens, int64_t k, int64_t d,
                                float* y, cudaStream_t stream);
void launch_moe_combine_backward(const float* dy, const float* routed, int64_t routed_rows,
                                 const int32_t* route_row, const float* weights, int64_t tokens,
                                 int64_t k, int64_t d, float* d_routed, float* d_weights,
                                 cudaStream_t stream);

// router_topk.cu: kernels/ops.h's router operations, RouterTopkOptions mirrored in
// RouterTopkParams. The forward adds each expert's routes to expert_counts (device, zeroed by the
// caller); group_scores: [tokens, n_group] floats of scratch when the choice is the top selection
// scores and n_group > 1 (else unused). selection_bias and lb_score_grad may be null.
struct RouterTopkParams {
  bool sigmoid;       // scores: sigmoid of the logits, else their softmax
  bool topk_softmax;  // weights: softmax over the selected logits
  bool norm_topk_prob;
  bool random, balanced;  // the choice; neither: the top selection scores
  int64_t top_k, n_group, topk_group;
  float routed_scaling_factor;
  uint64_t seed;
  int64_t token_offset;
};
void launch_router_topk_forward(const float* logits, const float* selection_bias, float* scores,
                                int32_t* topk_index, float* topk_weight, int64_t* expert_counts,
                                float* group_scores, int64_t tokens, int64_t experts,
                                const RouterTopkParams& params, cudaStream_t stream);
// lb_score_grad: null, or a row of experts per lb_group_tokens consecutive tokens.
void launch_router_topk_backward(const float* logits, const float* scores,
                                 const int32_t* topk_index, const float* topk_weight,
                                 const float* d_weight, const float* lb_score_grad,
                                 int64_t lb_group_tokens, bool lb_uses_softmax, float z_grad_scale,
                                 float* dlogits, int64_t tokens, int64_t experts,
                                 const RouterTopkParams& params, cudaStream_t stream);
// counts[g, e] (+=, device, experts >= 1) for each route of group g of topk_index [routes] (groups
// equal runs of routes, groups dividing routes, at most 65535) naming e; an id outside
// [0, experts) counts nowhere.
void launch_route_counts(const int32_t* topk_index, int64_t routes, int64_t experts, int64_t groups,
                         int64_t* counts, cudaStream_t stream);
// *mean (device) = the mean over rows of logsumexp(row)^2 in double (row_values: [tokens] doubles
// of scratch); tokens > 0.
void launch_router_z_loss(const float* logits, int64_t tokens, int64_t experts, double* row_values,
                          double* mean, cudaStream_t stream);
// RouterProbability's values, summed per group of tokens / groups consecutive tokens (groups
// dividing tokens, at most 65535); the sums [groups, experts] land in the first groups x experts
// doubles of scratch, router_column_sums_scratch_bytes(tokens, experts, groups) bytes.
enum class RouterColumnValue : uint8_t { kScores, kSoftmaxOfLogits, kScoresOverRowSum };
int64_t router_column_sums_scratch_bytes(int64_t tokens, int64_t experts, int64_t groups);
void launch_router_probability_column_sums(const float* logits, const float* scores,
                                           RouterColumnValue value, int64_t tokens, int64_t experts,
                                           int64_t groups, void* scratch, cudaStream_t stream);

// route_order.cu: kernels/ops.h's order_routes_by_expert on topk_index [routes] (experts >= 1,
// routes < 2^31): dst_row [routes], expert_offsets [experts + 1] (device). An id outside
// [0, experts) is counted in no expert and gets dst_row -1.
void launch_order_routes_by_expert(const int32_t* topk_index, int64_t routes, int64_t experts,
                                   int32_t* dst_row, int64_t* expert_offsets, cudaStream_t stream);

// mx_quantize.cu: kernels/ops.h's MX quantisation, bit for bit as core/mx_types.h's rules (MxElem
// and MxScaleRule mirror mx::ElemType and mx::ScaleMode, which nvcc does not see here). cols, or
// rows when transposed, is a positive multiple of 32 (the caller checks it).
//   quantize: x [rows, cols] -> codes [rows, cols], scales [rows, cols / 32] (rows: all matrices);
//   quantize_transposed: x [batch, rows, cols] -> codes [batch, cols, rows], scales
//     [batch, cols, rows / 32] (blocks of 32 rows of each column);
//   dequantize: x[i] = decode(codes[i]) * 2^(scales[i / 32] - 127) for i < n (n a multiple of 32:
//     the codes of whole rows), one fp32 multiply, NaN for scale code 255.
enum class MxElem : uint8_t { kE4M3, kE5M2 };
enum class MxScaleRule : uint8_t { kRceil, kFloor };
void launch_mx_quantize(const float* x, int64_t rows, int64_t cols, MxElem elem, MxScaleRule rule,
                        uint8_t* codes, uint8_t* scales, cudaStream_t stream);
void launch_mx_quantize_transposed(const float* x, int64_t batch, int64_t rows, int64_t cols,
                                   MxElem elem, MxScaleRule rule, uint8_t* codes, uint8_t* scales,
                                   cudaStream_t stream);
void launch_mx_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t n, MxElem elem,
                          float* x, cudaStream_t stream);

// mx_gemm.cu: the same dequantisation rounded to bf16 (dst: bf16 bits, nearest even), the
// operands of the MX GEMMs on GPUs without MX tensor cores and of those cuBLASLt's block-scaled
// GEMMs do not take (exact for every element whose value lies in bf16's normal range).
void launch_mx_dequantize_to_bf16(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                  MxElem elem, uint16_t* dst, cudaStream_t stream);

// mx_scale_swizzle.cu: an operand's scales [rows, blocks] (row-major e8m0, blocks = k / 32) into
// the tiled layout of cuBLASLt's block-scaled GEMMs (kMxScaleTileRows x kMxScaleTileBlocks tiles,
// padded), dst: mx_swizzled_scale_bytes(rows, blocks) bytes, 4-byte aligned.
inline constexpr int64_t kMxScaleTileRows = 128, kMxScaleTileBlocks = 4;
constexpr int64_t mx_swizzled_scale_bytes(int64_t rows, int64_t blocks) {
  return (rows + kMxScaleTileRows - 1) / kMxScaleTileRows * kMxScaleTileRows *
         ((blocks + kMxScaleTileBlocks - 1) / kMxScaleTileBlocks * kMxScaleTileBlocks);
}
void launch_mx_swizzle_scales(const uint8_t* scales, int64_t rows, int64_t blocks, uint8_t* dst,
                              cudaStream_t stream);

// flash_attention.cu: kernels/ops.h's flash_attention_forward and _backward on q, out, dout, dq
// [B, T, heads, hd], k, v, dk, dv [B, T, kv_heads, hd], lse [B, heads, T], doc_start [B, T] or
// null (values read clamped to [0, position]); bf16: the GEMM operands rounded to bf16. head_dim
// <= kFlashAttentionMaxHeadDim (the caller checks). The backward's row_dots: B T heads floats of
// scratch (D = dout . out per query row).
inline constexpr int64_t kFlashAttentionMaxHeadDim = 256;
void launch_flash_attention_forward(const float* q, const float* k, const float* v,
                                    const int32_t* doc_start, float* out, float* lse, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                    bool bf16, cudaStream_t stream);
void launch_flash_attention_backward(const float* dout, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const int32_t* doc_start, float* dq, float* dk, float* dv,
                                     float* row_dots, int64_t batch, int64_t seq, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, bool bf16,
                                     cudaStream_t stream);

// flash_attention_tensor_cores.cu: the same pair in bf16 on tensor cores, head_dim <=
// kFlashTensorCoreMaxHeadDim (launch_flash_attention_forward and _backward choose it); scale:
// the scores' 1 / sqrt(head_dim); row_dots: D, computed.
inline constexpr int64_t kFlashTensorCoreMaxHeadDim = 128;
void launch_flash_attention_tc_forward(const float* q, const float* k, const float* v,
                                       const int32_t* doc_start, float* out, float* lse,
                                       int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                       int64_t head_dim, float scale, cudaStream_t stream);
void launch_flash_attention_tc_backward(const float* dout, const float* q, const float* k,
                                        const float* v, const float* lse, const float* row_dots,
                                        const int32_t* doc_start, float* dq, float* dk, float* dv,
                                        int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                        int64_t head_dim, float scale, cudaStream_t stream);

// cached_attention.cu: kernels/ops.h's cached_attention_forward on q, out [n, heads, hd] and the
// cache's k, v [first_position + n, kv_heads, hd]; first_position + n <=
// cached_attention_max_keys() (the caller checks): the scores of a query live in shared memory.
int64_t cached_attention_max_keys();
void launch_cached_attention_forward(const float* q, const float* k_cache, const float* v_cache,
                                     float* out, int64_t n, int64_t heads, int64_t kv_heads,
                                     int64_t hd, int64_t first_position, cudaStream_t stream);

}  // namespace moecore::kernels::cuda
