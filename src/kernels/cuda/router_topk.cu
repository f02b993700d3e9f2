// The router: one warp per token (a router has at most a few hundred experts, a handful per lane),
// its fp32 arithmetic in the CPU backend's steps (kernels/cpu/router_topk.cpp) except that a row's
// sums and maxima run as warp butterflies. The top-k takes k rounds of a warp argmax, each the
// best expert after the previous pick in the order (key descending, index ascending): nothing per
// lane remembers the chosen set, and the order is total, so the picks are distinct. Every
// reduction has a fixed shape and no float atomics (the expert counts' integer atomics are exact),
// so results repeat bit for bit run to run.
#include <climits>
#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/sigmoid_score_epsilon.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int64_t kMaxBlocks = 65536;  // more tokens loop within the warps
constexpr unsigned int kFullMask = 0xffffffffu;
constexpr int kNoExpert = INT_MAX;  // after every expert in the order
constexpr int kCountThreads = 256;
constexpr int64_t kMaxCountBlocks = 1024;
constexpr int kMaxSharedCountExperts = 8192;  // 32 KiB of per-block counts
constexpr int kTotalThreads = 256;
// The column sums' token chunks: their number depends on the token count only, so the order of
// the additions is fixed.
constexpr int64_t kColumnChunkRows = 64;
constexpr int64_t kMaxColumnChunks = 256;
constexpr int kMaxColumnThreads = 256;

unsigned int token_blocks(int64_t tokens) {
  const int64_t blocks = (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ int lane_id() {
  return static_cast<int>(threadIdx.x % 32);
}
__device__ int64_t first_warp_token() {
  return int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ int64_t warp_token_stride() {
  return int64_t{gridDim.x} * kWarpsPerBlock;
}

// core/splitmix64.h's mix64 and SplitMix64 draws, the same bit arithmetic re-implemented for the
// device (nvcc does not run the header's host functions there): random routes must replay alike
// on every backend.
constexpr uint64_t kSplitMixIncrement = 0x9e3779b97f4a7c15ULL;
__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// SplitMix64(state)'s draw e: the state advances by the increment before each draw, so a lane
// computes its experts' draws without the ones before them.
__device__ uint64_t splitmix_draw(uint64_t state, int e) {
  return mix64(state + (static_cast<uint64_t>(e) + 1) * kSplitMixIncrement);
}

// A NaN selection score ranks with -inf: the order stays total, so k picks always exist.
__device__ float rank_key(float x) {
  return isnan(x) ? -INFINITY : x;
}

// (ka, a) comes before (kb, b): the higher key first, equal keys to the lower index.
template <typename K>
__device__ bool before(K ka, int a, K kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// The `count` first of candidates [0, n) in the order, handed to emit(j, candidate) in every lane;
// `lowest` is the least key (the "none yet" sentinel sorts after any candidate holding it).
template <typename K, typename KeyOf, typename Eligible, typename Emit>
__device__ void select_first(int n, int64_t count, K lowest, K highest, KeyOf key_of,
                             Eligible eligible, Emit emit) {
  K prev_key = highest;
  int prev = -1;
  for (int64_t j = 0; j < count; ++j) {
    K best_key = lowest;
    int best = kNoExpert;
    for (int e = lane_id(); e < n; e += 32) {
      if (!eligible(e)) continue;
      const K key = key_of(e);
      if (before(prev_key, prev, key, e) && before(key, e, best_key, best)) {
        best_key = key;
        best = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const K other_key = __shfl_xor_sync(kFullMask, best_key, offset);
      const int other = __shfl_xor_sync(kFullMask, best, offset);
      if (before(other_key, other, best_key, best)) {
        best_key = other_key;
        best = other;
      }
    }
    emit(j, best);
    prev_key = best_key;
    prev = best;
  }
}

__global__ void router_topk_forward_kernel(const float* logits, const float* bias, float* scores,
                                           int32_t* topk_index, float* topk_weight,
                                           float* group_scores, int64_t tokens, int experts,
                                           RouterTopkParams o) {
  const int lane = lane_id();
  const int64_t k = o.top_k;
  const int n_group = static_cast<int>(o.n_group);
  const int group_size = experts / n_group;
  for (int64_t t = first_warp_token(); t < tokens; t += warp_token_stride()) {
    const float* z = logits + t * experts;
    float* p = scores + t * experts;
    if (o.sigmoid) {
      for (int e = lane; e < experts; e += 32)
        p[e] = 1.0f / (1.0f + expf(-z[e])) + kSigmoidScoreEpsilon;
    } else {
      float max_z = -INFINITY;
      for (int e = lane; e < experts; e += 32) max_z = fmaxf(max_z, z[e]);
      max_z = warp_reduce(max_z, MaxOp{});
      float sum = 0.0f;
      for (int e = lane; e < experts; e += 32) sum += expf(z[e] - max_z);
      sum = warp_reduce(sum, SumOp{});
      for (int e = lane; e < experts; e += 32) p[e] = expf(z[e] - max_z) / sum;
    }
    // The choice and lane 0's weights read other lanes' scores.
    __syncwarp();

    int32_t* index = topk_index + t * k;
    const int64_t global_t = o.token_offset + t;
    auto take = [&](int64_t j, int e) {
      if (lane == 0) index[j] = e;
    };
    auto everyone = [](int) { return true; };
    if (o.balanced) {
      if (lane == 0)
        for (int64_t j = 0; j < k; ++j)
          index[j] = static_cast<int32_t>((global_t * k + j) % experts);
    } else if (o.random) {
      const uint64_t state = mix64(o.seed ^ mix64(static_cast<uint64_t>(global_t)));
      select_first<uint64_t>(
          experts, k, 0, ~uint64_t{0}, [&](int e) { return splitmix_draw(state, e); }, everyone,
          take);
    } else {
      // Selection keys: the scores, or with topk_softmax the logits (OLMo-core ranks its logits
      // there), plus the selection bias.
      const float* base = o.topk_softmax ? z : p;
      auto selection = [&](int e) { return bias != nullptr ? base[e] + bias[e] : base[e]; };
      auto key = [&](int e) { return rank_key(selection(e)); };
      if (n_group > 1) {
        // Group score: the sum of the group's two best selection scores (DeepSeek-V3).
        float* gs = group_scores + t * n_group;
        for (int g = lane; g < n_group; g += 32) {
          const int first = g * group_size;
          float best = selection(first), second = -INFINITY;
          for (int i = 1; i < group_size; ++i) {
            const float q = selection(first + i);
            if (q > best) {
              second = best;
              best = q;
            } else if (q > second) {
              second = q;
            }
          }
          gs[g] = group_size > 1 ? best + second : best;
        }
        __syncwarp();
        // The last kept group bounds the kept ones in the group order.
        int last_kept = 0;
        select_first<float>(
            n_group, o.topk_group, -INFINITY, INFINITY, [&](int g) { return rank_key(gs[g]); },
            everyone, [&](int64_t, int g) { last_kept = g; });
        const float last_kept_key = rank_key(gs[last_kept]);
        select_first<float>(
            experts, k, -INFINITY, INFINITY, key,
            [&](int e) {
              const int g = e / group_size;
              return !before(last_kept_key, last_kept, rank_key(gs[g]), g);
            },
            take);
      } else {
        select_first<float>(experts, k, -INFINITY, INFINITY, key, everyone, take);
      }
    }

    // Lane 0 wrote the chosen experts; the weights' sums over k run in the CPU's order.
    if (lane == 0) {
      float* w = topk_weight + t * k;
      if (o.topk_softmax) {
        float max_z = z[index[0]];
        for (int64_t j = 1; j < k; ++j) max_z = max_z < z[index[j]] ? z[index[j]] : max_z;
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          w[j] = expf(z[index[j]] - max_z);
          sum += w[j];
        }
        for (int64_t j = 0; j < k; ++j) w[j] /= sum;
      } else {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          w[j] = p[index[j]];
          sum += w[j];
        }
        if (o.norm_topk_prob)
          for (int64_t j = 0; j < k; ++j) w[j] /= sum;
      }
      if (o.routed_scaling_factor != 1.0f)
        for (int64_t j = 0; j < k; ++j) w[j] *= o.routed_scaling_factor;
    }
  }
}

// Routes per expert of group blockIdx.y (its `routes` routes, counted into its row of counts): a
// block's counts in shared memory first (kShared), then one atomic per expert and block, so that
// the global counters see few colliding atomics.
template <bool kShared>
__global__ void router_count_kernel(const int32_t* group_index, int64_t routes, int experts,
                                    unsigned long long* group_counts) {
  extern __shared__ unsigned int block_counts[];
  const int32_t* index = group_index + blockIdx.y * routes;
  unsigned long long* counts = group_counts + int64_t{blockIdx.y} * experts;
  if constexpr (kShared) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x) block_counts[e] = 0;
    __syncthreads();
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < routes; r += stride) {
    const int32_t e = index[r];
    if (e < 0 || e >= experts) continue;
    if constexpr (kShared)
      atomicAdd(&block_counts[e], 1u);
    else
      atomicAdd(&counts[e], 1ULL);
  }
  if constexpr (kShared) {
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
      if (block_counts[e] != 0)
        atomicAdd(&counts[e], static_cast<unsigned long long>(block_counts[e]));
  }
}

// The CPU backend's backward (kernels/cpu/router_topk.cpp) per token: dL/dscores gathered in the
// dlogits row itself (lane 0, slots in order), then turned into dL/dlogits lane by lane.
__global__ void router_topk_backward_kernel(const float* logits, const float* scores,
                                            const int32_t* topk_index, const float* topk_weight,
                                            const float* d_weight, const float* lb_rows,
                                            int64_t lb_group_tokens, bool lb_uses_softmax,
                                            float z_grad_scale, float* dlogits, int64_t tokens,
                                            int experts, RouterTopkParams o) {
  const int lane = lane_id();
  const int64_t k = o.top_k;
  const bool renormalised = o.norm_topk_prob || o.topk_softmax;
  const float f = o.routed_scaling_factor;
  for (int64_t t = first_warp_token(); t < tokens; t += warp_token_stride()) {
    // The load-balancing gradient's row of this token's group (one row: every token's).
    const float* lb = lb_rows != nullptr ? lb_rows + t / lb_group_tokens * experts : nullptr;
    const float* z = logits + t * experts;
    const float* p = scores + t * experts;
    const int32_t* idx = topk_index + t * k;
    const float* wt = topk_weight + t * k;
    const float* dwt = d_weight + t * k;
    float* dz = dlogits + t * experts;
    for (int e = lane; e < experts; e += 32) dz[e] = 0.0f;
    __syncwarp();
    if (lane == 0) {
      // An index outside the experts (no forward writes one) adds nothing rather than touching
      // other memory.
      auto valid = [&](int32_t e) { return e >= 0 && e < experts; };
      if (renormalised) {
        float sum_sel = 0.0f, dot = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          if (valid(idx[j])) sum_sel += p[idx[j]];
          dot += dwt[j] * wt[j];
        }
        for (int64_t j = 0; j < k; ++j)
          if (valid(idx[j])) dz[idx[j]] += (f * dwt[j] - dot) / sum_sel;
      } else {
        for (int64_t j = 0; j < k; ++j)
          if (valid(idx[j])) dz[idx[j]] += f * dwt[j];
      }
    }
    __syncwarp();

    // The row's softmax statistics, where the z-loss or a softmax load-balancing term of a sigmoid
    // router needs them.
    const bool lb_softmax_of_sigmoid = o.sigmoid && lb != nullptr && lb_uses_softmax;
    float max_z = 0.0f, sum_exp = 1.0f, lse = 0.0f;
    if (z_grad_scale != 0.0f || lb_softmax_of_sigmoid) {
      max_z = -INFINITY;
      for (int e = lane; e < experts; e += 32) max_z = fmaxf(max_z, z[e]);
      max_z = warp_reduce(max_z, MaxOp{});
      float sum = 0.0f;
      for (int e = lane; e < experts; e += 32) sum += expf(z[e] - max_z);
      sum_exp = warp_reduce(sum, SumOp{});
      lse = max_z + logf(sum_exp);
    }
    auto soft = [&](int e) { return expf(z[e] - max_z) / sum_exp; };
    const float z_factor = z_grad_scale * 2.0f * lse;

    if (!o.sigmoid) {
      auto dscore = [&](int e) { return lb != nullptr ? dz[e] + lb[e] : dz[e]; };
      float dot = 0.0f;
      for (int e = lane; e < experts; e += 32) dot += dscore(e) * p[e];
      dot = warp_reduce(dot, SumOp{});
      for (int e = lane; e < experts; e += 32) {
        float g = p[e] * (dscore(e) - dot);
        if (z_grad_scale != 0.0f) g += z_factor * p[e];
        dz[e] = g;
      }
    } else {
      // OLMo-core's probabilities q_e = s_e / S_all: dL/ds_e = (g_e - sum_i g_i q_i) / S_all.
      const bool lb_row_sum = lb != nullptr && !lb_uses_softmax;
      float sum_all = 1.0f, lb_dot = 0.0f;
      if (lb_row_sum) {
        float sum = 0.0f;
        for (int e = lane; e < experts; e += 32) sum += p[e];
        sum_all = warp_reduce(sum, SumOp{});
        float dot = 0.0f;
        for (int e = lane; e < experts; e += 32) dot += lb[e] * (p[e] / sum_all);
        lb_dot = warp_reduce(dot, SumOp{});
      }
      float soft_dot = 0.0f;
      if (lb_softmax_of_sigmoid) {
        float dot = 0.0f;
        for (int e = lane; e < experts; e += 32) dot += lb[e] * soft(e);
        soft_dot = warp_reduce(dot, SumOp{});
      }
      for (int e = lane; e < experts; e += 32) {
        float dscore = dz[e];
        if (lb_row_sum) dscore += (lb[e] - lb_dot) / sum_all;
        // The scores hold sigmoid + epsilon; the Jacobian is the sigmoid's own, from the logit.
        const float sig = 1.0f / (1.0f + expf(-z[e]));
        float g = dscore * sig * (1.0f - sig);
        if (lb_softmax_of_sigmoid) g += soft(e) * (lb[e] - soft_dot);
        if (z_grad_scale != 0.0f) g += z_factor * soft(e);
        dz[e] = g;
      }
    }
  }
}

// logsumexp(row)^2 per row, the CPU's steps: the max in fp32, the sum of exponentials in double.
__global__ void router_lse_squared_kernel(const float* logits, int64_t tokens, int experts,
                                          double* row_values) {
  const int lane = lane_id();
  for (int64_t t = first_warp_token(); t < tokens; t += warp_token_stride()) {
    const float* z = logits + t * experts;
    float max_z = -INFINITY;
    for (int e = lane; e < experts; e += 32) max_z = fmaxf(max_z, z[e]);
    max_z = warp_reduce(max_z, MaxOp{});
    double sum = 0.0;
    for (int e = lane; e < experts; e += 32) sum += exp(static_cast<double>(z[e] - max_z));
    sum = warp_reduce(sum, SumOp{});
    const double lse = static_cast<double>(max_z) + log(sum);
    if (lane == 0) row_values[t] = lse * lse;
  }
}

// One block: values[0, n) added in double, each thread over a fixed stride, then the warps' sums
// in warp order; *mean = the sum / n.
__global__ void mean_in_fixed_order_kernel(const double* values, int64_t n, double* mean) {
  __shared__ double warp_sums[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += values[i];
  sum = warp_reduce(sum, SumOp{});
  if (lane_id() == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double all = 0.0;
    for (unsigned int w = 0; w < blockDim.x / 32; ++w) all += warp_sums[w];
    *mean = all / static_cast<double>(n);
  }
}

// Per row, what the column sums divide by: (max, sum of exp(z - max)) of the logits, or (unused,
// sum of the scores).
__global__ void router_row_stats_kernel(const float* logits, const float* scores, bool softmax,
                                        int64_t tokens, int experts, float* stats) {
  const int lane = lane_id();
  for (int64_t t = first_warp_token(); t < tokens; t += warp_token_stride()) {
    float max_z = 0.0f, sum = 0.0f;
    if (softmax) {
      const float* z = logits + t * experts;
      max_z = -INFINITY;
      for (int e = lane; e < experts; e += 32) max_z = fmaxf(max_z, z[e]);
      max_z = warp_reduce(max_z, MaxOp{});
      for (int e = lane; e < experts; e += 32) sum += expf(z[e] - max_z);
    } else {
      const float* p = scores + t * experts;
      for (int e = lane; e < experts; e += 32) sum += p[e];
    }
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) {
      stats[2 * t] = max_z;
      stats[2 * t + 1] = sum;
    }
  }
}

// Column e of token chunk blockIdx.y of group blockIdx.z (group_rows consecutive tokens): the
// chunk's probabilities in token order, in double, into out[group, chunk, e] (out is the sums
// themselves when there is one chunk).
__global__ void router_column_chunk_kernel(const float* logits, const float* scores,
                                           RouterColumnValue value, const float* stats,
                                           int64_t group_rows, int experts, int64_t chunk_rows,
                                           double* out) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= experts) return;
  const int64_t group_begin = blockIdx.z * group_rows, group_end = group_begin + group_rows;
  const int64_t begin = group_begin + blockIdx.y * chunk_rows;
  const int64_t end = begin + chunk_rows < group_end ? begin + chunk_rows : group_end;
  double sum = 0.0;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t at = t * experts + e;
    const float v = value == RouterColumnValue::kScores ? scores[at]
                    : value == RouterColumnValue::kSoftmaxOfLogits
                        ? expf(logits[at] - stats[2 * t]) / stats[2 * t + 1]
                        : scores[at] / stats[2 * t + 1];
    sum += static_cast<double>(v);
  }
  out[(int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * experts + e] = sum;
}

// sums[group, e] = the group's chunks' sums of column e, chunks in order (group: blockIdx.y).
__global__ void router_column_reduce_kernel(const double* partial, int64_t chunks, int experts,
                                            double* sums) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= experts) return;
  const double* group_partial = partial + blockIdx.y * chunks * experts;
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += group_partial[c * experts + e];
  sums[int64_t{blockIdx.y} * experts + e] = sum;
}

int64_t column_chunks(int64_t tokens) {
  const int64_t chunks = (tokens + kColumnChunkRows - 1) / kColumnChunkRows;
  return chunks < kMaxColumnChunks ? (chunks > 0 ? chunks : 1) : kMaxColumnChunks;
}

// Whole warps, no more threads than there are experts.
int column_threads(int64_t experts) {
  const int64_t threads = (experts + 31) / 32 * 32;
  return static_cast<int>(threads < kMaxColumnThreads ? threads : kMaxColumnThreads);
}

}  // namespace

void launch_router_topk_forward(const float* logits, const float* selection_bias, float* scores,
                                int32_t* topk_index, float* topk_weight, int64_t* expert_counts,
                                float* group_scores, int64_t tokens, int64_t experts,
                                const RouterTopkParams& params, cudaStream_t stream) {
  if (tokens <= 0 || experts <= 0) return;
  const int e_count = static_cast<int>(experts);
  router_topk_forward_kernel<<<token_blocks(tokens), kThreads, 0, stream>>>(
      logits, selection_bias, scores, topk_index, topk_weight, group_scores, tokens, e_count,
      params);
  launch_route_counts(topk_index, tokens * params.top_k, experts, 1, expert_counts, stream);
}

void launch_route_counts(const int32_t* topk_index, int64_t routes, int64_t experts, int64_t groups,
                         int64_t* counts, cudaStream_t stream) {
  if (routes <= 0 || experts <= 0 || groups <= 0) return;
  const int e_count = static_cast<int>(experts);
  const int64_t group_routes = routes / groups;
  const int64_t blocks = (group_routes + kCountThreads - 1) / kCountThreads;
  const dim3 grid(static_cast<unsigned int>(blocks < kMaxCountBlocks ? blocks : kMaxCountBlocks),
                  static_cast<unsigned int>(groups));
  // int64_t and unsigned long long are both 64-bit; the counts never come near 2^63.
  auto* device_counts = reinterpret_cast<unsigned long long*>(counts);
  if (e_count <= kMaxSharedCountExperts)
    router_count_kernel<true><<<grid, kCountThreads, sizeof(unsigned int) * e_count, stream>>>(
        topk_index, group_routes, e_count, device_counts);
  else
    router_count_kernel<false>
        <<<grid, kCountThreads, 0, stream>>>(topk_index, group_routes, e_count, device_counts);
}

void launch_router_topk_backward(const float* logits, const float* scores,
                                 const int32_t* topk_index, const float* topk_weight,
                                 const float* d_weight, const float* lb_score_grad,
                                 int64_t lb_group_tokens, bool lb_uses_softmax, float z_grad_scale,
                                 float* dlogits, int64_t tokens, int64_t experts,
                                 const RouterTopkParams& params, cudaStream_t stream) {
  if (tokens <= 0 || experts <= 0) return;
  router_topk_backward_kernel<<<token_blocks(tokens), kThreads, 0, stream>>>(
      logits, scores, topk_index, topk_weight, d_weight, lb_score_grad, lb_group_tokens,
      lb_uses_softmax, z_grad_scale, dlogits, tokens, static_cast<int>(experts), params);
}

void launch_router_z_loss(const float* logits, int64_t tokens, int64_t experts, double* row_values,
                          double* mean, cudaStream_t stream) {
  if (tokens <= 0) return;
  router_lse_squared_kernel<<<token_blocks(tokens), kThreads, 0, stream>>>(
      logits, tokens, static_cast<int>(experts), row_values);
  mean_in_fixed_order_kernel<<<1, kTotalThreads, 0, stream>>>(row_values, tokens, mean);
}

int64_t router_column_sums_scratch_bytes(int64_t tokens, int64_t experts, int64_t groups) {
  const int64_t chunks = column_chunks(tokens / groups);
  const int64_t doubles = groups * experts + (chunks > 1 ? groups * chunks * experts : 0);
  return doubles * static_cast<int64_t>(sizeof(double)) +
         2 * tokens * static_cast<int64_t>(sizeof(float));
}

void launch_router_probability_column_sums(const float* logits, const float* scores,
                                           RouterColumnValue value, int64_t tokens, int64_t experts,
                                           int64_t groups, void* scratch, cudaStream_t stream) {
  if (tokens <= 0 || experts <= 0 || groups <= 0) return;
  const int e_count = static_cast<int>(experts);
  // Each group in chunks of its own rows, as a call for that group's tokens alone would sum it.
  const int64_t group_rows = tokens / groups;
  const int64_t chunks = column_chunks(group_rows);
  const int64_t chunk_rows = (group_rows + chunks - 1) / chunks;
  // The sums, the chunks' partial sums (more than one chunk), then the row statistics.
  const int64_t sum_count = groups * experts;
  double* sums = static_cast<double*>(scratch);
  double* partial = chunks > 1 ? sums + sum_count : sums;
  float* stats = reinterpret_cast<float*>(sums + sum_count + (chunks > 1 ? chunks * sum_count : 0));
  if (value != RouterColumnValue::kScores)
    router_row_stats_kernel<<<token_blocks(tokens), kThreads, 0, stream>>>(
        logits, scores, value == RouterColumnValue::kSoftmaxOfLogits, tokens, e_count, stats);
  const int threads = column_threads(experts);
  const unsigned int column_blocks = static_cast<unsigned int>((experts + threads - 1) / threads);
  const dim3 grid(column_blocks, static_cast<unsigned int>(chunks),
                  static_cast<unsigned int>(groups));
  router_column_chunk_kernel<<<grid, threads, 0, stream>>>(logits, scores, value, stats, group_rows,
                                                           e_count, chunk_rows, partial);
  if (chunks > 1)
    router_column_reduce_kernel<<<dim3(column_blocks, static_cast<unsigned int>(groups)), threads,
                                  0, stream>>>(partial, chunks, e_count, sums);
}

}  // namespace moecore::kernels::cuda
