// The distribution each weight starts from (train.init_method): moecore's own, or one of
// OLMo-core's InitMethods as its OLMoDDP model applies them (olmo_core/nn/transformer/init.py:
// init_embeddings, init_attention, init_moe_v2, init_final_w_out). Every weight is a zero-mean
// normal, truncated at 3 standard deviations where OLMo-core uses trunc_normal_; norms start at 1
// and the selection bias at 0 under every method (model/params.cpp).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace moecore {

struct ParamSpec;

enum class InitMethod {
  kMoecore,     // N(0, std) for every weight, untruncated
  kNormal,      // OLMo-core's normal: trunc N(0, std) everywhere (embedding: embedding_std)
  kLlama,       // normal, with output projections and the MoE block at std / sqrt(2 layers),
                // the embedding N(0, 1), the LM head d^-1/2
  kLlamaDepth,  // llama with std / sqrt(2 (layer + 1)) instead
  kFanIn,       // each matrix at its fan-in^-1/2 (shared experts and dense MLPs: std), the
                // embedding N(0, 1)
};

struct InitOptions {
  InitMethod method = InitMethod::kMoecore;
  double std = 0.02;            // OLMo-core's init_std
  double embedding_std = -1.0;  // OLMo-core's embedding_init_std (normal; moecore's); < 0: std
};

struct InitDistribution {
  double std;
  bool truncated;  // at +-3 std, as torch's trunc_normal_(a=-3 std, b=3 std)
};

// The distribution of one weight (not a norm or a buffer) of a model of `config`. A tied embedding
// is the embedding's (as OLMo-core's trained models re-tie the head to it).
InitDistribution init_distribution(const ModelConfig& config, const InitOptions& options,
                                   const ParamSpec& spec);

}  // namespace moecore
