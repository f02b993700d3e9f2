#include "plan/activation_model.h"

#include <algorithm>
#include <cmath>

#include "plan/units.h"

namespace moecore::plan {

namespace {

// An MXFP8 value: an E4M3 code, and its share of the block's E8M0 scale.
constexpr double kMx = 1.0 + 1.0 / 32.0;
constexpr double kB16 = 2.0;  // a bf16 value

// Bytes per value of the experts' kept inputs.
double kept_input_bytes(KeptExpertInputs kept) {
  switch (kept) {
    case KeptExpertInputs::kBf16:
      return kB16;
    case KeptExpertInputs::kMx:
      return kMx;
    case KeptExpertInputs::kFp32:
      break;
  }
  return kF;
}

// The groups of tokens the load-balancing terms are per: the micro-batch's instances under
// instance granularity, else one.
double lb_groups(const ModelConfig& c, const TokenShape& t) {
  return c.lb_loss_granularity == LbLossGranularity::kInstance
             ? static_cast<double>(std::max<int64_t>(t.rows, 1))
             : 1.0;
}

}  // namespace

ActivationBytes chunk_activation_bytes(const ModelConfig& c, const ChunkShape& chunk,
                                       const TokenShape& t, ActivationRecompute recompute) {
  const double n = static_cast<double>(t.tokens()), b = static_cast<double>(t.rows);
  const double seq = static_cast<double>(t.seq), d = static_cast<double>(c.hidden_size);
  const double qs = static_cast<double>(c.q_size()), kvs = static_cast<double>(c.kv_size());
  const double nh = static_cast<double>(c.num_attention_heads);
  const double nkv = static_cast<double>(c.num_key_value_heads);
  const double e = static_cast<double>(c.num_experts),
               k = static_cast<double>(c.num_experts_per_tok);
  const double h = static_cast<double>(c.moe_intermediate_size);
  const double hs = static_cast<double>(c.shared_expert_intermediate_size);
  const double v = static_cast<double>(c.vocab_size);
  const double routes = n * k;  // balanced routing
  const bool padded = t.padded_capacity_factor > 0.0;
  // The experts' rows: the routes, or the padded transport's static capacity.
  const double received = padded ? t.padded_capacity(routes) : routes;
  const double act = static_cast<double>(dtype_size(t.mlp_act));  // a dense MLP's SwiGLU output
  const double shared_act = static_cast<double>(dtype_size(t.shared_expert_act));
  ActivationBytes a;
  // Transformer::Activations: residual[layers + 1], tokens on the embedding's chunk.
  a.residual = kF * (static_cast<double>(chunk.layers) + 1.0) * n * d;
  if (chunk.has_embedding) a.residual += kF * n;
  for (int64_t i = chunk.first_layer; i < chunk.first_layer + chunk.layers; ++i) {
    // LayerCache: rstd1, h1 (attention sublayer), mid, rstd2, h2 (feed-forward sublayer); the
    // reordered norms' attn_out and ffn_out take h1's and h2's place. Recompute drops a
    // sublayer's share (Transformer::release_recomputed), "full" also mid.
    const bool attention_kept = !recomputes_attention(recompute);
    const bool ffn_kept = !recomputes_ffn(recompute);
    if (attention_kept) a.norms += kF * (n + n * d);
    if (recompute != ActivationRecompute::kFull) a.norms += kF * n * d;
    if (ffn_kept) a.norms += kF * (n + n * d);
    // AttentionCache: q, k, v, lse [B, nh, T] (flash attention: no T x T probabilities),
    // context; QK-norm keeps the raw projections.
    if (attention_kept) {
      a.attention += kF * (2.0 * n * qs + 2.0 * n * kvs + b * nh * seq);
      if (c.qk_norm == QkNorm::kFull)
        a.attention += kF * (n * qs + n * kvs + 2.0 * n);
      else if (c.qk_norm == QkNorm::kPerHead)
        a.attention += kF * (n * qs + n * kvs + n * nh + n * nkv);
    }
    if (c.layer_is_dense(i)) {
      if (ffn_kept) a.dense_mlp += (2.0 * kF + act) * n * static_cast<double>(c.intermediate_size);
      continue;
    }
    // RouterState: logits, scores [N, E]; top-k ids and weights [N, k]; counts [E] (int64). It
    // stays under recompute (batch statistics and metrics read it).
    double moe = kF * (2.0 * n * e + 2.0 * routes) + 8.0 * e;
    if (!ffn_kept) {
      a.moe += moe;
      continue;
    }
    moe += kF * routes;  // send_pos
    // Expert inputs, gate/up output, activation (expert-major), outputs back at the source; in
    // bf16 the inputs and the activation as bf16 roundings, in mxfp8 as MXFP8 copies (MoeBlock
    // lends their fp32 buffers: lent_expert_input_bytes).
    const double expert_inputs = received * d + received * h;
    moe += kept_input_bytes(t.expert_inputs) * expert_inputs + kF * 2.0 * received * h +
           kF * routes * d;
    if (t.ep > 1 && t.dispatch == Dispatch::kSync)
      moe += kF * (received * d + received);  // y_perm, recv_to_expert
    if (padded)  // y_perm; the maps: per position, 3 per slot, per row; dropped
      moe += kF * received * d +
             4.0 * (routes + 3.0 * static_cast<double>(t.ep) * t.padded_block(routes) + received) +
             8.0;
    if (t.ep > 1 && t.dispatch == Dispatch::kRowwise) moe += 8.0 * routes;  // RowTarget per route
    moe += (2.0 * kF + shared_act) * n * hs;                                // shared expert gu, act
    a.moe += moe;
  }
  // rstd, hidden, and the whole head's logits (the chunked head keeps none).
  if (chunk.has_head) a.head = kF * (n + n * d + (t.head_chunk_tokens > 0 ? 0.0 : n * v));
  // The routers' loss statistics and gradient: per MoE layer a row of E per group (the instances
  // under lb_loss_granularity "instance"): lb_score_grad (f32), route counts (i64) and probability
  // sums (f64, and the z-loss's mean).
  const double lb_rows = static_cast<double>(chunk.layers) * lb_groups(c, t);
  a.head += (kF + 16.0) * lb_rows * e + 8.0 * static_cast<double>(chunk.layers);
  return a;
}

double lent_expert_input_bytes(const ModelConfig& c, const TokenShape& t) {
  if (t.expert_inputs == KeptExpertInputs::kFp32 || c.num_experts == 0) return 0.0;
  // The rows the experts' buffers have: the padded transport's capacity, else the routes.
  const double routes = static_cast<double>(t.tokens() * c.num_experts_per_tok);
  const double received = t.padded_capacity_factor > 0.0 ? t.padded_capacity(routes) : routes;
  // bf16's SwiGLU writes its output in bf16 alone; MXFP8 quantises it from fp32.
  const int64_t lent_width = t.expert_inputs == KeptExpertInputs::kMx
                                 ? c.hidden_size + c.moe_intermediate_size
                                 : c.hidden_size;
  return kF * received * static_cast<double>(lent_width);
}

double recomputed_layer_bytes(const ModelConfig& c, int64_t layer, const TokenShape& t,
                              ActivationRecompute recompute) {
  const ChunkShape one{layer, 1, false, false};
  return chunk_activation_bytes(c, one, t, ActivationRecompute::kNone).total() -
         chunk_activation_bytes(c, one, t, recompute).total();
}

double recompute_buffer_bytes(const ModelConfig& c, const ChunkShape& chunk, const TokenShape& t,
                              ActivationRecompute recompute) {
  ActivationBytes largest;
  for (int64_t i = chunk.first_layer; i < chunk.first_layer + chunk.layers; ++i) {
    const ChunkShape one{i, 1, false, false};
    const ActivationBytes kept = chunk_activation_bytes(c, one, t, ActivationRecompute::kNone);
    const ActivationBytes left = chunk_activation_bytes(c, one, t, recompute);
    largest.residual = std::max(largest.residual, kept.residual - left.residual);
    largest.norms = std::max(largest.norms, kept.norms - left.norms);
    largest.attention = std::max(largest.attention, kept.attention - left.attention);
    largest.dense_mlp = std::max(largest.dense_mlp, kept.dense_mlp - left.dense_mlp);
    largest.moe = std::max(largest.moe, kept.moe - left.moe);
  }
  return largest.total();
}

double chunk_pass_scratch_bytes(const ModelConfig& c, const ChunkShape& chunk,
                                const TokenShape& t) {
  const double n = static_cast<double>(t.tokens()), d = static_cast<double>(c.hidden_size);
  const double qs = static_cast<double>(c.q_size()), kvs = static_cast<double>(c.kv_size());
  const double e = static_cast<double>(c.num_experts),
               k = static_cast<double>(c.num_experts_per_tok);
  const double h = static_cast<double>(c.moe_intermediate_size);
  const double hs = static_cast<double>(c.shared_expert_intermediate_size);
  const double v = static_cast<double>(c.vocab_size);
  const double routes = n * k;
  const bool exchange = t.ep > 1 && t.dispatch == Dispatch::kSync;
  const bool padded = t.padded_capacity_factor > 0.0;
  const double received = padded ? t.padded_capacity(routes) : routes;
  // The padded transport's send and receive blocks (one pair at a time).
  const double blocks =
      padded ? 2.0 * kF * static_cast<double>(t.ep) * t.padded_block(routes) * d : 0.0;
  bool has_dense = false, has_moe = false;
  for (int64_t i = chunk.first_layer; i < chunk.first_layer + chunk.layers; ++i)
    (c.layer_is_dense(i) ? has_dense : has_moe) = true;

  // Backward (Transformer::backward_chunk): dx lives throughout; the head's phase adds dhidden and
  // the logits' gradient (the chunked head: one chunk's logits and their gradient); then dbranch
  // and the dense scratch (kept across layers) plus one layer's temporaries at a time.
  const double head_rows = static_cast<double>(t.head_rows());
  double head_phase = 0.0;
  if (chunk.has_head)
    head_phase = kF * (n * d + (t.head_chunk_tokens > 0 ? 2.0 * head_rows : n) * v);
  double layers_base = kF * n * d + kF * lb_groups(c, t) * e;  // dbranch, lb_grad
  // A dense MLP's scratch: dact [n, I] in fp32, dgu [n, 2I] in its act's dtype.
  const double act = static_cast<double>(dtype_size(t.mlp_act));
  const double shared_act = static_cast<double>(dtype_size(t.shared_expert_act));
  if (has_dense) layers_base += (kF + 2.0 * act) * n * static_cast<double>(c.intermediate_size);
  double attention = kF * (2.0 * n * qs + 2.0 * n * kvs);                // d_context, dq, dk, dv
  if (c.qk_norm != QkNorm::kNone) attention += kF * (n * qs + n * kvs);  // dq_pre, dk_pre
  double moe = 0.0;
  if (has_moe) {
    // MoeBlock::backward: dy_send, d_weight, dx_send, then the experts' scratch (and the
    // exchange's four copies), the shared expert's scratch, the router's dlogits.
    const double combine = kF * (2.0 * routes * d + routes);
    // dact [R, H] and dgu [R, 2H] (in bf16 the latter as bf16 bits)
    double experts = kF * received * h +
                     (t.expert_inputs == KeptExpertInputs::kBf16 ? kB16 : kF) * 2.0 * received * h;
    // mxfp8: the output gradients' codes ([R, d], then [R, 2H]) and the buffer that the saved
    // inputs are dequantised into, in bf16, for the weight gradients (all R rows: of H, then d).
    if (t.expert_inputs == KeptExpertInputs::kMx)
      experts += kMx * received * std::max(d, 2.0 * h) + kB16 * received * std::max(d, h);
    if (exchange) experts += kF * 4.0 * received * d;
    if (padded) experts += blocks + kF * 2.0 * received * d;  // and dy, dx of the experts' rows
    moe = combine + std::max({experts, (kF + 2.0 * shared_act) * n * hs, kF * n * e});
  }
  const double backward = kF * n * d + std::max(head_phase, layers_base + std::max(attention, moe));

  // Forward: the branch buffer, and the exchange's send and receive copies of one MoE layer (the
  // receive buffer carries the token rows in and the outputs back), or later the chunked head's
  // logits of one chunk.
  double forward_layer = 0.0, forward_head = 0.0;
  if (has_moe && exchange) forward_layer = kF * (routes * d + received * d);
  if (has_moe && padded) forward_layer = blocks;
  if (chunk.has_head && t.head_chunk_tokens > 0) forward_head = kF * head_rows * v;
  const double forward = kF * n * d + std::max(forward_layer, forward_head);
  return std::max(forward, backward);
}

double operand_copy_bytes(const ModelConfig& c, const std::vector<ChunkShape>& chunks,
                          const TokenShape& t, const PrecisionRecipe& recipe, bool device) {
  using Precision = PrecisionRecipe::Precision;
  const double n = static_cast<double>(t.tokens()), d = static_cast<double>(c.hidden_size);
  const double qs = static_cast<double>(c.q_size()), kvs = static_cast<double>(c.kv_size());
  const double dense_h = static_cast<double>(c.intermediate_size);
  const double shared_h = static_cast<double>(c.shared_expert_intermediate_size);
  const double h = static_cast<double>(c.moe_intermediate_size);
  const double head_rows = static_cast<double>(t.head_rows());
  const double routes = n * static_cast<double>(c.num_experts_per_tok);
  const double received = t.padded_capacity_factor > 0.0 ? t.padded_capacity(routes) : routes;
  // Which of the rank's modules multiply in bf16 (their weights' bf16 copies) or in MXFP8.
  bool dense = false, moe = false, head = false;
  for (const ChunkShape& chunk : chunks) {
    head = head || chunk.has_head;
    for (int64_t i = chunk.first_layer; i < chunk.first_layer + chunk.layers; ++i)
      (c.layer_is_dense(i) ? dense : moe) = true;
  }
  const bool shared = moe && shared_h > 0.0;
  const bool projections_bf16 = recipe.attention == Precision::kBf16 && !recipe.mx.attention;
  const bool mlp_bf16 = recipe.dense_mlp == Precision::kBf16;
  const bool mx_dense = mx_swiglu_mlp(recipe.mx, SwigluMlp::kDenseLayer),
             mx_shared = mx_swiglu_mlp(recipe.mx, SwigluMlp::kSharedExpert);
  const bool dense_bf16 = dense && mlp_bf16 && !mx_dense,
             shared_bf16 = shared && mlp_bf16 && !mx_shared;
  // The MX shared expert's bf16 weight gradients (without mxfp8_expert_wgrad): GEMMs on fp32
  // operands, which the CPU's bf16 GEMM converts.
  const bool shared_bf16_wgrad = shared && mlp_bf16 && mx_shared && !recipe.mx.expert_wgrad;
  const bool head_bf16 = head && recipe.lm_head == Precision::kBf16;

  // linear.cpp's slots: the attention's input [n, d], which q, k and v share; the output gradient
  // of each bf16 linear (the MLPs' down projections: their SwiGLU's gradient comes in bf16).
  double bytes = projections_bf16 ? kB16 * n * d : 0.0;
  double grad_slot = 0.0;
  auto grad = [&](bool bf16, double rows, double cols) {
    if (bf16) grad_slot = std::max(grad_slot, kB16 * rows * cols);
  };
  grad(projections_bf16, n, std::max({d, qs, kvs}));
  grad(dense_bf16 || shared_bf16, n, d);
  grad(head_bf16, head_rows, static_cast<double>(c.vocab_size));
  bytes += grad_slot;

  // linear.cpp's MX scratch, each buffer at the largest operand it holds: codes and scales of an
  // operand along its features ([rows, in] forward, [rows, out] input gradient) or of dy along the
  // tokens ([out, rows], weight gradient), those of x along the tokens ([in, rows]), and the
  // token-padded fp32 copy they are quantised from (the last two only for an MX weight gradient:
  // the shared expert's is bf16 without mxfp8_expert_wgrad). MX linears over n tokens; under
  // mxfp8_expert_wgrad the experts' weight gradients over one expert's rows (balanced routing).
  double along_features = 0.0, along_tokens_x = 0.0, padded_copy = 0.0;
  auto mx_linear = [&](double rows, double in, double out, bool mx_weight_grad) {
    const double padded_rows = std::ceil(rows / 32.0) * 32.0;
    along_features = std::max(along_features, padded_rows * std::max(in, out));
    if (!mx_weight_grad) return;
    along_tokens_x = std::max(along_tokens_x, padded_rows * in);
    padded_copy = std::max(padded_copy, padded_rows * std::max(in, out));
  };
  if (recipe.mx.attention) {
    mx_linear(n, d, std::max(qs, kvs), true);
    mx_linear(n, qs, d, true);
  }
  if (mx_dense && dense) {
    mx_linear(n, d, 2.0 * dense_h, true);
    mx_linear(n, dense_h, d, true);
  }
  if (mx_shared && shared) {
    mx_linear(n, d, 2.0 * shared_h, recipe.mx.expert_wgrad);
    mx_linear(n, shared_h, d, recipe.mx.expert_wgrad);
  }
  if (recipe.mx.expert_wgrad && moe && c.num_experts > 0) {
    const double expert_rows =
        received / static_cast<double>(std::max<int64_t>(1, c.num_experts / t.ep));
    mx_linear(expert_rows, d, 2.0 * h, true);
    mx_linear(expert_rows, h, d, true);
  }
  bytes += kMx * (along_features + along_tokens_x) + kF * padded_copy;
  if (device) return bytes;

  // The CPU's bf16 GEMMs: an fp32 operand converted, A's buffer and B's each at the largest it
  // has held (the forward's A and the weight gradient's B are the same activations): the
  // attention's context into its output projection, the MLPs' input (their gate/up projection),
  // the LM head's input; and the MX shared expert's bf16 weight gradients, dy^T . x on fp32
  // operands: A the output gradients ([n, d], [n, 2Hs]), B the inputs ([n, Hs], [n, d]).
  double converted = 0.0;
  if (projections_bf16) converted = std::max(converted, n * qs);
  if (dense_bf16 || shared_bf16) converted = std::max(converted, n * d);
  if (head_bf16) converted = std::max(converted, head_rows * d);
  double converted_a = converted, converted_b = converted;
  if (shared_bf16_wgrad) {
    converted_a = std::max(converted_a, n * std::max(d, 2.0 * shared_h));
    converted_b = std::max(converted_b, n * std::max(d, shared_h));
  }
  bytes += kB16 * (converted_a + converted_b);
  // The grouped GEMM's rounding of the experts' fp32 output gradients: the down projection's
  // [R, d] in bf16; in mxfp8 (bf16 weight gradients) also the SwiGLU's gradient [R, 2H].
  if (moe && c.num_experts > 0) {
    if (t.expert_inputs == KeptExpertInputs::kBf16) bytes += kB16 * received * d;
    if (t.expert_inputs == KeptExpertInputs::kMx) bytes += kB16 * received * std::max(d, 2.0 * h);
  }
  // Flash attention's bf16 copies of q, k, v and the output gradient: the attention core runs in
  // the attention's precision whether or not its projections are MX linears.
  if (recipe.attention == Precision::kBf16) bytes += kB16 * n * (2.0 * qs + 2.0 * kvs);
  return bytes;
}

}  // namespace moecore::plan
