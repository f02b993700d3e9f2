#include "plan/op_cost.h"

#include <algorithm>
#include <numeric>

#include "model/flop_count.h"
#include "model/precision_recipe.h"
#include "plan/units.h"

namespace moecore::plan {

namespace {

// The FLOP/s of a module's three GEMMs as the run's precision recipe multiplies them
// (model/precision_recipe.h): forward, input gradient, weight gradient.
struct GemmRates {
  double forward, input_grad, weight_grad;
};

struct Roofline {
  double bandwidth;  // bytes/s, times the rank's share of cores
  bool overlapped;   // Rates::gemm_overlaps_memory
  // C[m, n] = A[m, k] B[k, n] at `flops` FLOP/s: its FLOPs at that rate and its operands streamed
  // once through memory, the larger of the two where the hardware overlaps them, else their sum.
  double gemm(double flops, double m, double n, double k) const {
    const double compute = 2.0 * m * n * k / flops;
    const double memory = kF * (m * k + k * n + m * n) / bandwidth;
    return overlapped ? std::max(compute, memory) : compute + memory;
  }
  // A layer's GEMM in a pass: the forward runs it once, the backward twice (input and weight
  // gradients, the same FLOPs each), each at its module's rate.
  double pass_gemm(bool forward, const GemmRates& rates, double m, double n, double k) const {
    if (forward) return gemm(rates.forward, m, n, k);
    return gemm(rates.input_grad, m, n, k) + gemm(rates.weight_grad, m, n, k);
  }
};

// Each module's GEMM rates under the run's recipe, times the rank's share of cores.
struct ModuleRates {
  GemmRates router, attention, dense_mlp, experts, lm_head;
  double attention_core;  // the attention core's score and context products
};

ModuleRates module_rates(const PrecisionRecipe& recipe, const Rates& rates, double share) {
  const auto rate = [&](kernels::MatmulPrecision p) {
    return share *
           (p == kernels::MatmulPrecision::kBf16 ? rates.gemm_flops_bf16 : rates.gemm_flops_fp32);
  };
  const double mx =
      share * (rates.gemm_flops_mxfp8 > 0.0 ? rates.gemm_flops_mxfp8 : rates.gemm_flops_bf16);
  const auto all = [](double r) { return GemmRates{r, r, r}; };
  const MxRecipe& m = recipe.mx;
  return {
      .router = all(rate(recipe.router)),
      .attention = all(m.attention ? mx : rate(recipe.attention)),
      .dense_mlp = all(m.dense_mlp ? mx : rate(recipe.dense_mlp)),
      .experts = {m.experts ? mx : rate(recipe.experts), m.experts ? mx : rate(recipe.experts),
                  m.expert_wgrad ? mx : rate(recipe.experts)},
      .lm_head = all(rate(recipe.lm_head)),
      .attention_core = rate(recipe.attention),
  };
}

}  // namespace

std::string time_category_name(TimeCategory c) {
  switch (c) {
    case TimeCategory::kAttention:
      return "attention";
    case TimeCategory::kDenseMlp:
      return "dense_mlp";
    case TimeCategory::kExperts:
      return "experts";
    case TimeCategory::kLmHead:
      return "lm_head";
    case TimeCategory::kElementwise:
      return "elementwise";
    case TimeCategory::kExpertExchange:
      return "expert_exchange";
    case TimeCategory::kPipelineWait:
      return "pipeline_wait";
    case TimeCategory::kGradReduce:
      return "grad_reduce";
    case TimeCategory::kOptimizer:
      return "optimizer";
    case TimeCategory::kCount:
      break;
  }
  return "?";
}

double total_seconds(const Seconds& s) {
  return std::accumulate(s.begin(), s.end(), 0.0);
}

double rank_share(const Rates& rates, const ResolvedLayout& layout) {
  if (rates.cores_per_node <= 0.0) return 1.0;
  const int64_t on_node =
      rates.node_ranks > 0 ? std::min(rates.node_ranks, layout.world) : layout.world;
  return std::min(1.0, rates.cores_per_node / static_cast<double>(on_node));
}

bool group_on_one_node(const Rates& rates, int64_t group_size, int64_t stride, int64_t world) {
  // Groups are blocks of consecutive ranks (ep), or strided (ep_dp, pp); a block of group x
  // stride ranks that fits in a node stays on it.
  return rates.node_ranks <= 0 || world <= rates.node_ranks ||
         group_size * stride <= rates.node_ranks;
}

Link group_link(const Rates& rates, int64_t group_size, int64_t stride, int64_t world) {
  if (group_on_one_node(rates, group_size, stride, world))
    return {rates.link_bandwidth, rates.link_latency};
  return {rates.network_bandwidth, rates.network_latency};
}

Link group_link(const Rates& rates, const ResolvedLayout& layout, int64_t group_size,
                int64_t stride) {
  Link link = group_link(rates, group_size, stride, layout.world);
  if (!rates.async_communication) link.bandwidth *= rank_share(rates, layout);
  return link;
}

// One pass as if nothing were recomputed.
static Seconds plain_pass_seconds(const RunConfig& config, const ResolvedLayout& layout,
                                  const ChunkShape& chunk, const Rates& rates, bool forward) {
  const ModelConfig& c = config.model;
  const TrainConfig& tc = config.train;
  const double share = rank_share(rates, layout);
  const Roofline roof{rates.memory_bandwidth * share, rates.gemm_overlaps_memory};
  const PrecisionRecipe recipe = PrecisionRecipe::from_train(tc.precision, tc.mxfp8);
  const ModuleRates r = module_rates(recipe, rates, share);
  // Values per second a quantiser turns into MXFP8 (measured), else a memory pass: 4 bytes read,
  // 1 written plus a scale per 32.
  const double quantize_rate =
      share * (rates.mx_quantize_values > 0.0 ? rates.mx_quantize_values
                                              : rates.memory_bandwidth / (5.0 + 1.0 / 32.0));
  TokenShape tokens{layout.local_rows, tc.seq_len, layout.ep, config.parallel.dispatch};
  tokens.padded_capacity_factor = padded_capacity_factor(config.parallel, layout.ep);
  tokens.expert_inputs = kept_expert_inputs(recipe);  // the bytes the element-wise passes move
  tokens.mlp_act = kept_mlp_act_dtype(recipe, SwigluMlp::kDenseLayer);
  tokens.shared_expert_act = kept_mlp_act_dtype(recipe, SwigluMlp::kSharedExpert);
  const double n = static_cast<double>(tokens.tokens());
  const double d = static_cast<double>(c.hidden_size);
  const double qs = static_cast<double>(c.q_size()), kvs = static_cast<double>(c.kv_size());
  const double experts_here = static_cast<double>(c.num_experts / layout.ep);
  const double k = static_cast<double>(c.num_experts_per_tok);
  const double h = static_cast<double>(c.moe_intermediate_size);
  const double hs = static_cast<double>(c.shared_expert_intermediate_size);
  // The attention core's FLOPs per token (scores and context over the causal positions), the
  // same count as the MFU numerator.
  const FlopsPerToken per_token = flops_per_token(c, tc.seq_len);
  const double layers = static_cast<double>(c.num_hidden_layers);
  const double core_flops = per_token.attention_scores / layers / 3.0;  // one forward, per token
  const double received = n * k;  // balanced: the rank's experts receive n k rows

  Seconds s{};
  auto add = [&s](TimeCategory cat, double seconds) { s[static_cast<int>(cat)] += seconds; };
  const double pass = forward ? 1.0 : 2.0;
  int64_t moe_layers = 0;
  for (int64_t i = chunk.first_layer; i < chunk.first_layer + chunk.layers; ++i) {
    add(TimeCategory::kAttention, roof.pass_gemm(forward, r.attention, n, qs + 2.0 * kvs, d) +
                                      roof.pass_gemm(forward, r.attention, n, d, qs) +
                                      pass * n * core_flops / r.attention_core);
    if (c.layer_is_dense(i)) {
      const double inter = static_cast<double>(c.intermediate_size);
      add(TimeCategory::kDenseMlp, roof.pass_gemm(forward, r.dense_mlp, n, 2.0 * inter, d) +
                                       roof.pass_gemm(forward, r.dense_mlp, n, d, inter));
      continue;
    }
    ++moe_layers;
    // Router, then each local expert's gate/up and down GEMMs over its share of the rows.
    double experts = roof.pass_gemm(forward, r.router, n, static_cast<double>(c.num_experts), d);
    const double rows = received / experts_here;
    experts += experts_here * (roof.pass_gemm(forward, r.experts, rows, 2.0 * h, d) +
                               roof.pass_gemm(forward, r.experts, rows, d, h));
    // MXFP8 experts quantise their GEMMs' activation operands: the forward its inputs [R, d] and
    // the SwiGLU output [R, H]; the backward the output gradients [R, d] and the gate/up
    // gradients [R, 2H], and dequantises the saved inputs (R (d + H)) for the bf16 weight
    // gradient (under mxfp8_expert_wgrad it quantises them along the tokens instead: as many
    // values, priced alike).
    if (recipe.mx.experts)
      experts += (forward ? received * (d + h) : received * (d + 2.0 * h) + received * (d + h)) /
                 quantize_rate;
    // The shared expert: in mxfp8 an expert (its forward and input gradient MX GEMMs, quantising
    // its inputs [n, d] and [n, Hs] and its output gradients [n, d] and [n, 2Hs]; its weight
    // gradient bf16 on those inputs, or under mxfp8_expert_wgrad an MX GEMM), else a dense MLP.
    if (hs > 0.0) {
      const GemmRates& shared = recipe.mx.experts ? r.experts : r.dense_mlp;
      experts += roof.pass_gemm(forward, shared, n, 2.0 * hs, d) +
                 roof.pass_gemm(forward, shared, n, d, hs);
      if (recipe.mx.experts)
        experts += (forward ? n * (d + hs) : n * (d + 2.0 * hs)) / quantize_rate;
    }
    add(TimeCategory::kExperts, experts);
  }
  if (chunk.has_head) {
    const double v = static_cast<double>(c.vocab_size);
    add(TimeCategory::kLmHead, roof.pass_gemm(forward, r.lm_head, n, v, d));
    // The chunked head computes its logits again in the backward.
    if (!forward && tc.lm_head_chunk_tokens > 0)
      add(TimeCategory::kLmHead, roof.pass_gemm(true, r.lm_head, n, v, d));
  }

  // Element-wise work: the forward writes each saved activation and reads it once; the backward
  // reads it, writes its gradient and reads that once.
  const double saved = chunk_activation_bytes(c, chunk, tokens, ActivationRecompute::kNone).total();
  add(TimeCategory::kElementwise, (forward ? 2.0 : 3.0) * saved / roof.bandwidth);

  // Expert parallelism: per MoE layer and pass, the rows bound for the other ep - 1 ranks go out
  // and their results come back (dispatch and combine forward; their gradients backward), each
  // way one message per peer.
  if (layout.ep > 1 && moe_layers > 0) {
    const Link link = group_link(rates, layout, layout.ep, 1);
    const double ep = static_cast<double>(layout.ep);
    // The padded transport sends its whole blocks, empty slots included.
    const double one_way = tokens.padded_capacity_factor > 0.0
                               ? kF * tokens.padded_block(n * k) * d * (ep - 1.0)
                               : kF * n * k * d * (ep - 1.0) / ep;
    add(TimeCategory::kExpertExchange,
        static_cast<double>(moe_layers) *
            (2.0 * one_way / link.bandwidth + 2.0 * (ep - 1.0) * link.latency));
  }
  return s;
}

Seconds chunk_pass_seconds(const RunConfig& config, const ResolvedLayout& layout,
                           const ChunkShape& chunk, const Rates& rates, bool forward) {
  Seconds s = plain_pass_seconds(config, layout, chunk, rates, forward);
  const ActivationRecompute recompute = config.train.recompute;
  if (forward || recompute == ActivationRecompute::kNone) return s;
  // Recompute: the backward first re-runs the dropped sublayers' forward (with its expert
  // exchange under expert parallelism) and writes their activations again.
  const Seconds again = plain_pass_seconds(config, layout, chunk, rates, true);
  auto add_again = [&](TimeCategory cat) {
    s[static_cast<int>(cat)] += again[static_cast<int>(cat)];
  };
  if (recomputes_attention(recompute)) add_again(TimeCategory::kAttention);
  if (recomputes_ffn(recompute)) {
    add_again(TimeCategory::kDenseMlp);
    add_again(TimeCategory::kExperts);
    add_again(TimeCategory::kExpertExchange);
  }
  const ModelConfig& c = config.model;
  TokenShape tokens{layout.local_rows, config.train.seq_len, layout.ep, config.parallel.dispatch};
  tokens.padded_capacity_factor = padded_capacity_factor(config.parallel, layout.ep);
  const PrecisionRecipe recipe =
      PrecisionRecipe::from_train(config.train.precision, config.train.mxfp8);
  tokens.expert_inputs = kept_expert_inputs(recipe);
  tokens.mlp_act = kept_mlp_act_dtype(recipe, SwigluMlp::kDenseLayer);
  tokens.shared_expert_act = kept_mlp_act_dtype(recipe, SwigluMlp::kSharedExpert);
  const double rebuilt =
      chunk_activation_bytes(c, chunk, tokens, ActivationRecompute::kNone).total() -
      chunk_activation_bytes(c, chunk, tokens, recompute).total();
  s[static_cast<int>(TimeCategory::kElementwise)] +=
      2.0 * rebuilt / (rates.memory_bandwidth * rank_share(rates, layout));
  return s;
}

}  // namespace moecore::plan
