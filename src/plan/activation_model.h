// Bytes of the activations the engine saves for the backward, per micro-batch, counted from the
// forward caches in src/model (Transformer::Activations / LayerCache, AttentionCache, MoeCache,
// RouterState), and the largest scratch the backward allocates on top of them. Everything is fp32
// (int32 for token and expert ids) whatever train.precision says (bf16 rounds GEMM operands), but
// the routed experts' inputs (x, the SwiGLU output), which are kept as their GEMMs read them:
// bf16 roundings in bf16, MXFP8 copies in mxfp8 (model/precision_recipe.h's KeptExpertInputs),
// and the dense SwiGLU MLPs' SwiGLU output and its gradient, bf16 in bf16 (kept_mlp_act_dtype).
//
// n = local rows x seq tokens of one rank; R = rows its experts receive (n k when routing is
// balanced, which is what is planned: the expectation under random routing too).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dist/rowwise_plan.h"
#include "model/activation_recompute.h"
#include "model/config.h"
#include "model/precision_recipe.h"
#include "train/run_config.h"

namespace moecore::plan {

// One micro-batch of one model chunk, by layer type.
struct ActivationBytes {
  double residual = 0.0;   // token ids and the residual stream entering every layer, and its output
  double norms = 0.0;      // per layer: the two RMSNorm outputs and statistics, the mid residual
  double attention = 0.0;  // q, k, v (and pre-QK-norm copies), softmax logsumexp, context
  double dense_mlp = 0.0;  // first_k_dense_replace layers: gate/up output and activation
  double moe = 0.0;        // router logits/scores/top-k, expert inputs, gate/up, activation,
                           // outputs back at the source, shared expert, dispatch bookkeeping
  double head = 0.0;       // final norm, logits and their loss gradient, load-balancing terms
  double total() const { return residual + norms + attention + dense_mlp + moe + head; }
};

struct ChunkShape {
  int64_t first_layer = 0;
  int64_t layers = 0;
  bool has_embedding = false;
  bool has_head = false;
};

// The padded transport's static sizes (model/padded_dispatch.h) for `routes` routes per rank:
// the rowwise capacity, the runtime's own rule (dist::rowwise_capacity), and the rows of each
// (source, destination) block, min(capacity, routes).
inline double padded_capacity_rows(double capacity_factor, double routes) {
  return static_cast<double>(dist::rowwise_capacity(capacity_factor, static_cast<int64_t>(routes)));
}
inline double padded_block_rows(double capacity_factor, double routes) {
  return std::min(padded_capacity_rows(capacity_factor, routes), routes);
}

struct TokenShape {
  int64_t rows = 1;  // sequences of this rank in one micro-batch
  int64_t seq = 1;
  int64_t ep = 1;
  Dispatch dispatch = Dispatch::kSync;
  // How the experts' inputs (x, the SwiGLU output) are kept (model/grouped_experts.h): bf16
  // roundings in bf16, MXFP8 copies in mxfp8 without mxfp8_expert_wgrad; in both their fp32
  // buffers are lent per layer.
  KeptExpertInputs expert_inputs = KeptExpertInputs::kFp32;
  // train.lm_head_chunk_tokens: > 0, the head keeps no logits and computes them again in the
  // backward, this many tokens at a time (model/chunked_lm_head.h).
  int64_t head_chunk_tokens = 0;
  // parallel.rowwise_transport = "padded" (ep > 1, rowwise): its capacity factor; 0: not padded.
  // Its experts' buffers have capacity rows, and its blocks ep x block rows (padded_dispatch.h).
  double padded_capacity_factor = 0.0;
  // How dense layers' SwiGLU MLPs and the shared expert keep their SwiGLU output and write its
  // gradient (kept_mlp_act_dtype): bf16 in bf16 without MX linears (the shared expert's are MX
  // in mxfp8, the dense layers' under mxfp8_dense).
  DType mlp_act = DType::kF32;
  DType shared_expert_act = DType::kF32;
  int64_t tokens() const { return rows * seq; }
  // The padded transport's rows kept per rank and rows per block, for `routes` routes per rank.
  double padded_capacity(double routes) const {
    return padded_capacity_rows(padded_capacity_factor, routes);
  }
  double padded_block(double routes) const {
    return padded_block_rows(padded_capacity_factor, routes);
  }
  // The rows of the head's logits alive at once: a chunk's, or the whole micro-batch's.
  int64_t head_rows() const {
    return head_chunk_tokens > 0 && head_chunk_tokens < tokens() ? head_chunk_tokens : tokens();
  }
};

// TokenShape::padded_capacity_factor for a run's [parallel] table and its ep.
inline double padded_capacity_factor(const ParallelConfig& pc, int64_t ep) {
  return ep > 1 && pc.dispatch == Dispatch::kRowwise && moves_padded_blocks(pc.rowwise_transport)
             ? pc.capacity_factor
             : 0.0;
}

// With train.recompute, what the forward keeps (model/activation_recompute.h): the block inputs,
// the router states of MoE layers, and the sublayers not recomputed.
ActivationBytes chunk_activation_bytes(const ModelConfig& c, const ChunkShape& chunk,
                                       const TokenShape& t, ActivationRecompute recompute);

// bf16 and mxfp8: the fp32 expert inputs one MoE block lends to each layer's forward (x of one
// micro-batch's routed rows, and in mxfp8 the SwiGLU output), allocated once per model chunk.
double lent_expert_input_bytes(const ModelConfig& c, const TokenShape& t);

// What the backward rebuilds for one layer under `recompute`.
double recomputed_layer_bytes(const ModelConfig& c, int64_t layer, const TokenShape& t,
                              ActivationRecompute recompute);

// The buffers a chunk rebuilds its layers into under `recompute`, kept for the whole run outside
// the workspace (Transformer's recycled cache, handed from layer to layer): each member at its
// largest over the chunk's layers, so a chunk with dense and MoE layers keeps both kinds. Counted
// per part (residual, norms, attention, dense MLP, MoE), each at its largest over the layers.
double recompute_buffer_bytes(const ModelConfig& c, const ChunkShape& chunk, const TokenShape& t,
                              ActivationRecompute recompute);

// The largest scratch alive at once while a chunk runs a forward or a backward pass (gradient of
// the residual stream, branch buffers, per-layer backward temporaries, dispatch send/receive
// copies): the high-water mark of the chunk's workspace (core/workspace.h), which keeps it for the
// whole run.
double chunk_pass_scratch_bytes(const ModelConfig& c, const ChunkShape& chunk, const TokenShape& t);

// The GEMM operand copies that live as long as the run, each kept at the largest operand it has
// held (none in fp32): model/linear.cpp's two rounding slots (the attention's input, which q, k
// and v share; the output gradient a linear's two backward GEMMs share, the largest being the LM
// head's logits gradient) and its MX quantisation scratch (MX linears; the experts' MX weight
// gradients), and on the CPU the bf16 GEMMs' conversions of fp32 operands (kernels/cpu/
// gemm_bf16.cpp: the attention's context, the MLPs' and the LM head's inputs), the grouped GEMM's
// rounding of the experts' fp32 output gradients (kernels/cpu/grouped_gemm.cpp) and flash
// attention's copies of q, k, v and the output gradient. These are thread-local and shared by
// the rank's chunks. Counted as on a CPU whose GEMMs multiply bf16 (AVX512-BF16, AMX), for the
// calling thread (flash attention's worker threads each keep a block of probabilities more). The
// emulated path of other CPUs keeps fp32 copies instead, not counted: the grouped GEMM's operands
// rounded or widened whole (its bf16 inputs too, so up to twice these bytes and more), the other
// GEMMs' operands per call.
double operand_copy_bytes(const ModelConfig& c, const std::vector<ChunkShape>& chunks,
                          const TokenShape& t, const PrecisionRecipe& recipe, bool device);

}  // namespace moecore::plan
