// Rotary position embedding (RoPE), exactly as Hugging Face transformers applies it to OLMoE,
// Qwen3-MoE and Llama: the non-interleaved "rotate_half" form, where dimension i pairs with
// dimension i + head_dim/2 (not 2i with 2i+1 as in the original paper / GPT-NeoX-interleaved).
// Checkpoints converted from HF therefore need no permutation of the q/k projection rows.
// The rotation itself is kernels::rope_forward / rope_backward (kernels/ops.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor_view.h"

namespace moecore {

// Precomputed cos/sin of every (position, frequency) pair. Built once per model (theta and
// head_dim are config constants) and shared by all layers, so the forward pass never calls cos/sin.
struct RopeTable {
  int64_t max_positions = 0;
  int64_t head_dim = 0;
  DeviceArray<float> cos;  // [max_positions, head_dim/2]
  DeviceArray<float> sin;  // [max_positions, head_dim/2]

  // inv_freq[i] = 1 / theta^(2i/head_dim), angle(t, i) = t * inv_freq[i], both rounded to float32
  // the way HF computes them, so positions far from 0 rotate by the same float angle as in HF.
  static RopeTable build(int64_t max_positions, int64_t head_dim, double theta);

  // The tables as kernels::rope_forward / rope_backward take them.
  ConstTensorView cos_view() const { return view(cos.data(), {max_positions, head_dim / 2}); }
  ConstTensorView sin_view() const { return view(sin.data(), {max_positions, head_dim / 2}); }
};

}  // namespace moecore
