#include "model/attention.h"

#include <algorithm>

#include "core/phase_timer.h"
#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

namespace {

// Rows and width of the QK-norm for a projection with `heads` heads.
struct NormGeometry {
  int64_t rows;
  int64_t dim;
};
NormGeometry norm_geometry(const ModelConfig& c, int64_t tokens, int64_t heads) {
  if (c.qk_norm == QkNorm::kPerHead) return {tokens * heads, c.head_size()};
  return {tokens, heads * c.head_size()};
}

}  // namespace

void AttentionBlock::forward(const AttentionWeights& w, const float* x, int64_t batch, int64_t seq,
                             float* y, AttentionCache& cache, const int32_t* doc_start) const {
  const ScopedPhase timer(Phase::kAttentionForward);
  const ModelConfig& c = config_;
  const int64_t n = batch * seq, d = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_size();
  cache.shape = {batch, seq, nh, nkv, hd};
  cache.q.resize(static_cast<size_t>(n * qs));
  cache.k.resize(static_cast<size_t>(n * kvs));
  cache.v.resize(static_cast<size_t>(n * kvs));
  cache.lse.resize(static_cast<size_t>(batch * nh * seq));
  cache.doc_start = doc_start;
  cache.context.resize(static_cast<size_t>(n * qs));

  // q, k and v read one x: in bf16 GEMMs rounded once for the three.
  const LinearInput x_in = shared_linear_input(precision_, w.q_proj, x, n, d);
  if (c.qk_norm == QkNorm::kNone) {
    linear_forward(precision_, x_in, w.q_proj, cache.q.data(), n, d, qs);
    linear_forward(precision_, x_in, w.k_proj, cache.k.data(), n, d, kvs);
  } else {
    cache.q_raw.resize(cache.q.size());
    cache.k_raw.resize(cache.k.size());
    linear_forward(precision_, x_in, w.q_proj, cache.q_raw.data(), n, d, qs);
    linear_forward(precision_, x_in, w.k_proj, cache.k_raw.data(), n, d, kvs);
    const NormGeometry gq = norm_geometry(c, n, nh), gk = norm_geometry(c, n, nkv);
    cache.q_rstd.resize(static_cast<size_t>(gq.rows));
    cache.k_rstd.resize(static_cast<size_t>(gk.rows));
    const float eps = static_cast<float>(c.rms_norm_eps);
    kernels::rmsnorm_forward(view(cache.q_raw.data(), {gq.rows, gq.dim}), view(w.q_norm, {gq.dim}),
                             view(cache.q.data(), {gq.rows, gq.dim}),
                             view(cache.q_rstd.data(), {gq.rows}), eps);
    kernels::rmsnorm_forward(view(cache.k_raw.data(), {gk.rows, gk.dim}), view(w.k_norm, {gk.dim}),
                             view(cache.k.data(), {gk.rows, gk.dim}),
                             view(cache.k_rstd.data(), {gk.rows}), eps);
  }
  linear_forward(precision_, x_in, w.v_proj, cache.v.data(), n, d, kvs);
  kernels::rope_forward(view(cache.q.data(), {batch, seq, nh, hd}), rope_.cos_view(),
                        rope_.sin_view(), 0);
  kernels::rope_forward(view(cache.k.data(), {batch, seq, nkv, hd}), rope_.cos_view(),
                        rope_.sin_view(), 0);
  kernels::flash_attention_forward(
      view(cache.q.data(), {batch, seq, nh, hd}), view(cache.k.data(), {batch, seq, nkv, hd}),
      view(cache.v.data(), {batch, seq, nkv, hd}), view(cache.context.data(), {batch, seq, nh, hd}),
      view(cache.lse.data(), {batch, nh, seq}),
      doc_start != nullptr ? view(doc_start, {batch, seq}) : ConstTensorView{}, precision_);
  linear_forward(precision_, cache.context.data(), w.o_proj, y, n, qs, d);
}

void AttentionBlock::backward(const AttentionWeights& w, const AttentionGrads& dw, const float* x,
                              const float* dy, const AttentionCache& cache, float* dx,
                              Workspace& workspace) const {
  const ScopedPhase timer(Phase::kAttentionBackward);
  const ModelConfig& c = config_;
  const AttentionShape& s = cache.shape;
  const int64_t n = s.batch * s.seq, d = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  Workspace::Scope scratch(workspace);
  // The gradients below are outputs that their operations write in full (the "=" rule of
  // kernels/ops.h's activation gradients): no zeroing pass.
  const std::span<float> d_context = scratch.uninitialized<float>(n * qs);
  linear_backward(precision_, dy, cache.context.data(), w.o_proj, d_context.data(), dw.o_proj, n,
                  qs, d, false);

  const std::span<float> dq = scratch.uninitialized<float>(n * qs);
  const std::span<float> dk = scratch.uninitialized<float>(n * kvs);
  const std::span<float> dv = scratch.uninitialized<float>(n * kvs);
  kernels::flash_attention_backward(
      view(d_context.data(), {s.batch, s.seq, s.n_heads, s.head_dim}),
      view(cache.q.data(), {s.batch, s.seq, s.n_heads, s.head_dim}),
      view(cache.k.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}),
      view(cache.v.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}),
      view(cache.context.data(), {s.batch, s.seq, s.n_heads, s.head_dim}),
      view(cache.lse.data(), {s.batch, s.n_heads, s.seq}),
      cache.doc_start != nullptr ? view(cache.doc_start, {s.batch, s.seq}) : ConstTensorView{},
      view(dq.data(), {s.batch, s.seq, s.n_heads, s.head_dim}),
      view(dk.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}),
      view(dv.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}), precision_);
  kernels::rope_backward(view(dq.data(), {s.batch, s.seq, s.n_heads, s.head_dim}), rope_.cos_view(),
                         rope_.sin_view(), 0);
  kernels::rope_backward(view(dk.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}),
                         rope_.cos_view(), rope_.sin_view(), 0);

  const float* dq_raw = dq.data();
  const float* dk_raw = dk.data();
  if (c.qk_norm != QkNorm::kNone) {
    const std::span<float> dq_pre = scratch.uninitialized<float>(n * qs);
    const std::span<float> dk_pre = scratch.uninitialized<float>(n * kvs);
    const NormGeometry gq = norm_geometry(c, n, s.n_heads), gk = norm_geometry(c, n, s.n_kv_heads);
    kernels::rmsnorm_backward(
        view(dq.data(), {gq.rows, gq.dim}), view(cache.q_raw.data(), {gq.rows, gq.dim}),
        view(w.q_norm, {gq.dim}), view(cache.q_rstd.data(), {gq.rows}),
        view(dq_pre.data(), {gq.rows, gq.dim}), view(dw.q_norm, {gq.dim}), false);
    kernels::rmsnorm_backward(
        view(dk.data(), {gk.rows, gk.dim}), view(cache.k_raw.data(), {gk.rows, gk.dim}),
        view(w.k_norm, {gk.dim}), view(cache.k_rstd.data(), {gk.rows}),
        view(dk_pre.data(), {gk.rows, gk.dim}), view(dw.k_norm, {gk.dim}), false);
    dq_raw = dq_pre.data();
    dk_raw = dk_pre.data();
  }
  // The three weight gradients read one x: rounded once for them, as in the forward.
  const LinearInput x_in = shared_linear_input(precision_, w.q_proj, x, n, d);
  linear_backward(precision_, dq_raw, x_in, w.q_proj, dx, dw.q_proj, n, d, qs, false);
  linear_backward(precision_, dk_raw, x_in, w.k_proj, dx, dw.k_proj, n, d, kvs, true);
  linear_backward(precision_, dv.data(), x_in, w.v_proj, dx, dw.v_proj, n, d, kvs, true);
}

}  // namespace moecore
