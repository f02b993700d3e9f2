// Rotary position embedding (RoPE), exactly as Hugging Face transformers applies it to OLMoE,
// Qwen3-MoE and Llama: the non-interleaved "rotate_half" form, where dimension i pairs with
// dimension i + head_dim/2 (not 2i with 2i+1 as in the original paper / GPT-NeoX-interleaved).
// Checkpoints converted from HF therefore need no permutation of the q/k projection rows.
//
// Activation gradients overwrite their outputs (here: in place), see the convention in DESIGN.md.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore {

// Precomputed cos/sin of every (position, frequency) pair. Built once per model (theta and
// head_dim are config constants) and shared by all layers, so the forward pass never calls cos/sin.
struct RopeTable {
  int64_t max_positions = 0;
  int64_t head_dim = 0;
  std::vector<float> cos;  // [max_positions, head_dim/2]
  std::vector<float> sin;  // [max_positions, head_dim/2]

  // inv_freq[i] = 1 / theta^(2i/head_dim), angle(t, i) = t * inv_freq[i], both rounded to float32
  // the way HF computes them, so positions far from 0 rotate by the same float angle as in HF.
  static RopeTable build(int64_t max_positions, int64_t head_dim, double theta);
};

// x: [batch, seq, n_heads, head_dim], rotated in place; the position of x[b, t] is t.
// Requires head_dim == table.head_dim and seq <= table.max_positions.
void rope_forward(float* x, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                  const RopeTable& table);

// dx: [batch, seq, n_heads, head_dim], in place: on entry dL/d(rope output), on exit dL/d(rope
// input). RoPE is an orthogonal rotation per pair, so this applies the inverse (transposed)
// rotation; nothing from the forward needs saving.
void rope_backward(float* dx, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                   const RopeTable& table);

}  // namespace moecore
