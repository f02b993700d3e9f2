// An optional observer of one forward/backward pass (moecore dump / diff): the transformer hands
// it every activation and every activation gradient it computes, in execution order, each under a
// name that a different build can reproduce. Unset (the default), the model names nothing.
//
// Names are Hugging Face module paths, the tensor being that module's output:
//   model.embed_tokens, model.layers.{i}.input_layernorm, .self_attn.{q_proj, k_proj} (before
//   QK-norm; with QK-norm only), .self_attn.{q, k, v} (entering the attention core, after QK-norm
//   and RoPE), .self_attn.context (the core's output), .self_attn.o_proj, .residual_attn (the
//   residual stream after the attention branch), .post_attention_layernorm, .mlp.gate (router
//   logits), .mlp.router_scores, .mlp.topk_index (i32), .mlp.topk_weight, .mlp.experts (each
//   route's expert output, [N, k, d] in (token, slot) order), .mlp.gate_up (dense layers), .mlp
//   (the FFN's output), .post_feedforward_layernorm, model.layers.{i} (the layer's output),
//   model.norm, lm_head (the logits).
// The norms are named by their parameters, so a reordered block (OLMo-2) reports
// post_attention_layernorm after the attention and post_feedforward_layernorm after the FFN.
// Gradients are "grad." + the activation's name, reported as the backward produces them.
#pragma once

#include <functional>
#include <string>

#include "core/tensor_view.h"

namespace moecore {

using TensorObserver = std::function<void(const std::string& name, ConstTensorView tensor)>;

}  // namespace moecore
