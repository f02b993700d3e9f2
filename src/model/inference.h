// Autoregressive inference with a KV cache, batch 1. The layer order and every sub-layer are those
// of Transformer::forward (same kernels: embedding, RMSNorm, linear, QK-norm, RoPE, SwiGLU MLP,
// MoeBlock), so decoding reproduces the training model's logits position by position; only the
// attention is rewritten, as queries over the cached keys/values instead of a full causal square.
//
// Use:
//   InferenceModel model(config, layout, params, /*max_seq=*/2048);
//   const std::vector<float>& logits = model.prefill(prompt);   // next-token logits [vocab]
//   int32_t next = sampler.sample(logits);
//   model.decode_step(next);                                   // appends, returns new logits
//
// The model reads `params` in place on every call: keep the buffers alive and unchanged while a
// sequence is in the cache (after changing weights, reset()). Its cache and scratch live on the
// default device (core/device_memory.h), which must be the one `params` are on; the logits come
// back to the host.
#pragma once

#include <cstdint>
#include <vector>

#include "core/workspace.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/moe_block.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/rope.h"

namespace moecore {

class InferenceModel {
 public:
  // Throws moecore::Error when the config is invalid, the layout lacks a parameter the config
  // needs, or max_seq is not positive.
  InferenceModel(const ModelConfig& config, const ParamLayout& layout, const ParamBuffers& params,
                 int64_t max_seq);
  ~InferenceModel();
  // The MoE block holds a reference to config_, so an InferenceModel stays where it was built.
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  // The operand precision of each module kind's GEMMs (default: fp32 everywhere); the attention
  // over the cache is fp32 whatever it says.
  void set_precision(const PrecisionRecipe& precision);

  // Empties the cache: the next prefill/decode_step starts a new sequence at position 0.
  void reset();

  // Appends the prompt (one or more tokens) at the current position, processed as one block, and
  // returns the next-token logits [vocab] of its last position. Call reset() first to start a new
  // sequence; prefill after earlier tokens continues the same sequence (multi-turn).
  const std::vector<float>& prefill(const std::vector<int32_t>& prompt);

  // Appends one token and returns its next-token logits [vocab].
  const std::vector<float>& decode_step(int32_t token);

  // Both throw a one-line moecore::Error, leaving the cache unchanged, when a token id is out of
  // [0, vocab_size), the prompt is empty, or the sequence would exceed max_seq. The returned
  // reference is the model's logits buffer: valid until the next call.

  const std::vector<float>& logits() const { return logits_; }  // of the last call, [vocab]
  int64_t length() const { return cache_.length(); }            // tokens in the cache
  int64_t max_seq() const { return cache_.max_seq(); }
  const ModelConfig& config() const { return config_; }
  const KvCache& cache() const { return cache_; }

 private:
  struct LayerWeights;

  // Runs n new tokens at positions [length, length + n) through the model; logits of the last.
  const std::vector<float>& forward(const int32_t* tokens, int64_t n);
  void attention(int64_t layer, int64_t n);  // q_ + cache -> context_
  void resize_scratch(int64_t n);

  ModelConfig config_;
  const ParamBuffers& params_;
  std::vector<LayerWeights> layers_;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* lm_head_ = nullptr;  // the embedding when tied
  RopeTable rope_;
  MoeBlock moe_;
  PrecisionRecipe precision_;  // its router, experts and shared expert entries: in moe_
  KvCache cache_;
  int64_t macs_per_token_ = 0;  // decides whether a forward call is worth threading

  // Scratch for one forward of n tokens (grown on demand, never shrunk), on the weights' device:
  // the tokens, the activations and the last position's logits, which logits_ holds on the host.
  DeviceArray<int32_t> tokens_;
  DeviceArray<float> x_, h_, rstd_, q_raw_, k_raw_, q_, k_, v_, qk_rstd_, context_, branch_;
  DeviceArray<float> mlp_gu_, mlp_act_, device_logits_;
  std::vector<float> logits_;
  MoeCache moe_cache_;
  Workspace moe_workspace_;  // the MoE dispatch's temporaries (none on one rank)
};

}  // namespace moecore
