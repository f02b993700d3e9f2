// Self-attention sub-layer: q/k/v projections -> optional QK-norm (full: OLMoE, over the whole
// projection; per_head: Qwen3, over each head) -> RoPE -> causal GQA attention -> o_proj.
// QK-norm is applied before RoPE, as both reference models do. The attention core is
// kernels::flash_attention_forward/backward: the forward saves each query's logsumexp, not the
// T x T probabilities, and the backward recomputes them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "core/workspace.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/precision_recipe.h"
#include "model/rope.h"

namespace moecore {

// The geometry of one attention call: q [B, T, n_heads, hd], k and v [B, T, n_kv_heads, hd].
struct AttentionShape {
  int64_t batch;
  int64_t seq;
  int64_t n_heads;     // query heads
  int64_t n_kv_heads;  // key/value heads; must divide n_heads
  int64_t head_dim;
};

// One attention layer's weights as its GEMMs read them: the fp32 master weights or, where the
// recipe multiplies attention in bf16, their bf16 copies (model/bf16_weight_copies.h), with their
// MX caches under train.mxfp8_dense (model/linear.h). The QK-norm gains are always fp32.
struct AttentionWeights {
  LinearWeight q_proj;  // [nh*hd, d]
  LinearWeight k_proj;  // [nkv*hd, d]
  LinearWeight v_proj;  // [nkv*hd, d]
  LinearWeight o_proj;  // [d, nh*hd]
  const float* q_norm;  // [nh*hd] (full) or [hd] (per_head) or nullptr
  const float* k_norm;
};

// The gradients (+=) of the same tensors, fp32.
struct AttentionGrads {
  float* q_proj;
  float* k_proj;
  float* v_proj;
  float* o_proj;
  float* q_norm;
  float* k_norm;
};

struct AttentionCache {
  AttentionShape shape{};
  DeviceArray<float> q_raw, k_raw;    // projections before QK-norm: [N, nh*hd], [N, nkv*hd]
  DeviceArray<float> q_rstd, k_rstd;  // QK-norm statistics
  DeviceArray<float> q, k, v;         // after QK-norm and RoPE
  DeviceArray<float> lse;             // softmax logsumexp of each query: [B, nh, T]
  DeviceArray<float> context;         // attention output before o_proj: [N, nh*hd]
  // The forward's document masking ([B, T], model/document_mask.h) or nullptr; not owned: the
  // transformer's activations hold it until the backward (which reads it again).
  const int32_t* doc_start = nullptr;
};

class AttentionBlock {
 public:
  AttentionBlock(const ModelConfig& config, const RopeTable& rope) : config_(config), rope_(rope) {}

  // The GEMM precision of the projections and the attention core: the recipe's attention entry
  // (default: fp32).
  void set_precision(const PrecisionRecipe& precision) { precision_ = precision.attention; }

  // x: [B*T, d] -> y: [B*T, d] (=). doc_start: [B, T] document masking (kernels::
  // flash_attention_forward) or nullptr; it must outlive the backward of this cache.
  void forward(const AttentionWeights& w, const float* x, int64_t batch, int64_t seq, float* y,
               AttentionCache& cache, const int32_t* doc_start = nullptr) const;
  // dy: [B*T, d] -> dx (=); parameter gradients into dw (+=). The temporaries (the gradients of
  // the context, q, k and v) come from `workspace`.
  void backward(const AttentionWeights& w, const AttentionGrads& dw, const float* x,
                const float* dy, const AttentionCache& cache, float* dx,
                Workspace& workspace) const;

 private:
  const ModelConfig& config_;
  const RopeTable& rope_;
  kernels::MatmulPrecision precision_ = kernels::MatmulPrecision::kFp32;
};

}  // namespace moecore
