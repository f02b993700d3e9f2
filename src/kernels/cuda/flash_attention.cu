// Flash attention: tiled kernels that never hold the T x T probabilities, every product on the
// CUDA cores: the fp32 path, and bf16's for head dimensions above kFlashTensorCoreMaxHeadDim. bf16
// below it runs on the tensor cores (flash_attention_tensor_cores.cu: the same algorithm).
//
// A block of kThreads threads owns kRows rows (queries in the forward and the dq pass, keys in the
// dk/dv pass), kTeam consecutive threads per row; each thread keeps the row's dimensions
// team_lane + kTeam t (t < kHd / kTeam) in registers, and a dot product is its partial sum added
// over the team by a butterfly of shuffles (the same bits in every lane of the team). The other
// side (keys and values, or queries and output gradients) streams through shared memory in tiles
// of kInner rows. Every sum runs in a fixed order, with no float atomics: the results do not
// depend on scheduling.
//
// Forward: one block per (batch, head, query tile); a first sweep over the key tiles keeps each
// row's running max and sum (the online softmax, fp32) and gives lse = max + log(sum); a second
// sweep accumulates P V with P = exp(score - lse), the normalised probability, so that bf16
// precision rounds the same operand as the CPU backend (which rounds the normalised softmax) and
// the backward's recomputed P is the forward's. Backward: D_t = dout_t . out_t per query row, then
// dq parallel over query tiles (looping over key tiles) and dk, dv parallel over key tiles
// (looping over the query tiles of every head of the kv head's group), each recomputing P.
//
// bf16 precision rounds every GEMM operand with __float2bfloat16_rn before its fp32 products, where
// kernels/cpu/flash_attention.cpp's GEMMs round them: q, k (scores); P, v (out); dout, v (dP);
// P, dout (dv); dS, k (dq); dS, q (dk).
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTeam = 8;                  // threads per row
constexpr int kRows = kThreads / kTeam;   // rows per block: 32
constexpr int kMaxInnerFloats = 64 * 64;  // one streamed tile: 16 KiB of floats
static_assert(kTeam == 8, "team_sum's butterfly has three steps");

// Rows per streamed tile for head dimensions up to kHd: two tiles fit 32 KiB of shared memory.
template <int kHd>
constexpr int kInnerRows = kMaxInnerFloats / kHd < 64 ? kMaxInnerFloats / kHd : 64;

__device__ inline float operand(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

// The sum over the kTeam lanes of a team (aligned groups of kTeam lanes of a warp). Each step adds
// the same two values in both lanes of a pair, and addition commutes, so the team agrees bit for
// bit. Every lane of the warp must call it.
__device__ inline float team_sum(float v) {
  v = v + __shfl_xor_sync(0xffffffffu, v, 1);
  v = v + __shfl_xor_sync(0xffffffffu, v, 2);
  v = v + __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// tile[r][d] = rows first + r of a [seq, row_stride] matrix at base, dimensions d < hd, rounded as
// the precision says; 0 past the sequence and past hd (so no product reads an unset value). The
// caller puts barriers around it.
template <int kInner, int kHd>
__device__ void load_tile(float (*tile)[kHd], const float* base, int64_t first, int64_t seq,
                          int64_t row_stride, int64_t hd, bool bf16) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kInner * kHd; idx += kThreads) {
    const int r = idx / kHd, d = idx % kHd;
    const int64_t row = first + r;
    tile[r][d] = row < seq && d < hd ? operand(base[row * row_stride + d], bf16) : 0.0f;
  }
}

// A row's dimensions team_lane + kTeam t of base + row * row_stride (0 where absent).
template <int kDims>
__device__ void load_row(float (&values)[kDims], const float* base, int64_t row, bool present,
                         int64_t row_stride, int64_t hd, int team_lane, bool bf16) {
#pragma unroll
  for (int t = 0; t < kDims; ++t) {
    const int64_t d = team_lane + kTeam * t;
    values[t] = present && d < hd ? operand(base[row * row_stride + d], bf16) : 0.0f;
  }
}

// This thread's part of the dot product of its row with tile row r.
template <int kDims, int kHd>
__device__ inline float partial_dot(const float (&values)[kDims], const float (*tile)[kHd], int r,
                                    int team_lane) {
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < kDims; ++t) sum += values[t] * tile[r][team_lane + kTeam * t];
  return sum;
}

// The first key any row of query tile [r0, r1) attends: 0 without documents (causal rows see
// every earlier key), else the earliest of the rows' document starts. first_key: shared; every
// thread calls it.
__device__ int64_t tile_first_key(const int32_t* doc_start, int64_t b, int64_t seq, int64_t r0,
                                  int64_t r1, long long* first_key) {
  if (threadIdx.x == 0) *first_key = r0;
  __syncthreads();
  if (threadIdx.x < kRows && r0 + threadIdx.x < r1)
    atomicMin(first_key, static_cast<long long>(row_start(doc_start, b, seq, r0 + threadIdx.x)));
  __syncthreads();
  return *first_key;
}

// grid (query tiles, heads, batch). q, out: [B, T, heads, hd]; k, v: [B, T, kv_heads, hd]; lse:
// [B, heads, T].
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const float* q, const float* k, const float* v, const int32_t* doc_start,
                         float* out, float* lse, int64_t seq, int64_t heads, int64_t kv_heads,
                         int64_t hd, float scale, bool bf16) {
  constexpr int kDims = kHd / kTeam, kInner = kInnerRows<kHd>;
  __shared__ float k_tile[kInner][kHd];
  __shared__ float v_tile[kInner][kHd];
  __shared__ long long first_key;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (heads / kv_heads);
  const int64_t r0 = blockIdx.x * int64_t{kRows};
  const int64_t r1 = r0 + kRows < seq ? r0 + kRows : seq;
  const int team_lane = static_cast<int>(threadIdx.x % kTeam);
  const int64_t i = r0 + threadIdx.x / kTeam;
  const bool active = i < seq;
  // Keys [lo, hi] of this row; none for a row past the sequence (whose thread still takes part in
  // the barriers and shuffles).
  const int64_t lo = active ? row_start(doc_start, b, seq, i) : 1, hi = active ? i : 0;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* qh = head_rows(q, b, seq, heads, h, hd);
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float q_row[kDims];
  load_row(q_row, qh, i, active, q_stride, hd, team_lane, bf16);
  const int64_t c_lo = tile_first_key(doc_start, b, seq, r0, r1, &first_key);

  // Sweep 1: the online softmax's running max m and sum l of exp(score - m), key by key.
  float m = -INFINITY, l = 0.0f;
  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();  // the previous tile's readers are done
    load_tile<kInner>(k_tile, kh, c, seq, kv_stride, hd, bf16);
    __syncthreads();
    for (int r = 0; r < kInner; ++r) {
      const float score = team_sum(partial_dot(q_row, k_tile, r, team_lane)) * scale;
      const int64_t j = c + r;
      if (j < lo || j > hi) continue;
      if (score > m) {
        l = l * expf(m - score) + 1.0f;  // m = -inf at the first key: l = 0 * 0 + 1
        m = score;
      } else {
        l += expf(score - m);
      }
    }
  }
  // l >= 1 for a row that attends at least itself.
  const float row_lse = m + logf(l);

  // Sweep 2: out = sum over keys of P v, P = exp(score - lse).
  float acc[kDims];
#pragma unroll
  for (int t = 0; t < kDims; ++t) acc[t] = 0.0f;
  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();
    load_tile<kInner>(k_tile, kh, c, seq, kv_stride, hd, bf16);
    load_tile<kInner>(v_tile, vh, c, seq, kv_stride, hd, bf16);
    __syncthreads();
    for (int r = 0; r < kInner; ++r) {
      const float score = team_sum(partial_dot(q_row, k_tile, r, team_lane)) * scale;
      const int64_t j = c + r;
      const float p = j >= lo && j <= hi ? operand(expf(score - row_lse), bf16) : 0.0f;
#pragma unroll
      for (int t = 0; t < kDims; ++t) acc[t] += p * v_tile[r][team_lane + kTeam * t];
    }
  }
  if (!active) return;  // no barrier follows
  if (team_lane == 0) lse[(b * heads + h) * seq + i] = row_lse;
  float* out_row = head_rows(out, b, seq, heads, h, hd) + i * q_stride;
#pragma unroll
  for (int t = 0; t < kDims; ++t) {
    const int64_t d = team_lane + kTeam * t;
    if (d < hd) out_row[d] = acc[t];
  }
}

// dots[row] = dout[row, :] . out[row, :] for the rows of [B, T, heads, hd] (so dots is [B, T,
// heads]): a warp per row, in double, lanes then the warp's butterfly.
__global__ void __launch_bounds__(kThreads)
    flash_row_dots_kernel(const float* dout, const float* out, float* dots, int64_t rows,
                          int64_t hd) {
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t row = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32; row < rows;
       row += warps) {
    double sum = 0.0;
    for (int64_t d = lane; d < hd; d += 32)
      sum += static_cast<double>(dout[row * hd + d]) * static_cast<double>(out[row * hd + d]);
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) dots[row] = static_cast<float>(sum);
  }
}

// grid (query tiles, heads, batch): dq = scale sum over keys of dS k, dS = P (dP - D),
// P = exp(score - lse), dP = dout . v.
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(const float* dout, const float* q, const float* k, const float* v,
                    const float* lse, const float* dots, const int32_t* doc_start, float* dq,
                    int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd, float scale,
                    bool bf16) {
  constexpr int kDims = kHd / kTeam, kInner = kInnerRows<kHd>;
  __shared__ float k_tile[kInner][kHd];
  __shared__ float v_tile[kInner][kHd];
  __shared__ long long first_key;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (heads / kv_heads);
  const int64_t r0 = blockIdx.x * int64_t{kRows};
  const int64_t r1 = r0 + kRows < seq ? r0 + kRows : seq;
  const int team_lane = static_cast<int>(threadIdx.x % kTeam);
  const int64_t i = r0 + threadIdx.x / kTeam;
  const bool active = i < seq;
  const int64_t lo = active ? row_start(doc_start, b, seq, i) : 1, hi = active ? i : 0;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* qh = head_rows(q, b, seq, heads, h, hd);
  const float* doh = head_rows(dout, b, seq, heads, h, hd);
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float q_row[kDims], do_row[kDims], acc[kDims];
  load_row(q_row, qh, i, active, q_stride, hd, team_lane, bf16);
  load_row(do_row, doh, i, active, q_stride, hd, team_lane, bf16);
#pragma unroll
  for (int t = 0; t < kDims; ++t) acc[t] = 0.0f;
  const float row_lse = active ? lse[(b * heads + h) * seq + i] : 0.0f;
  const float row_dot = active ? dots[(b * seq + i) * heads + h] : 0.0f;
  const int64_t c_lo = tile_first_key(doc_start, b, seq, r0, r1, &first_key);

  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();
    load_tile<kInner>(k_tile, kh, c, seq, kv_stride, hd, bf16);
    load_tile<kInner>(v_tile, vh, c, seq, kv_stride, hd, bf16);
    __syncthreads();
    for (int r = 0; r < kInner; ++r) {
      const float score = team_sum(partial_dot(q_row, k_tile, r, team_lane)) * scale;
      const float dp = team_sum(partial_dot(do_row, v_tile, r, team_lane));
      const int64_t j = c + r;
      const float ds =
          j >= lo && j <= hi ? operand(expf(score - row_lse) * (dp - row_dot), bf16) : 0.0f;
#pragma unroll
      for (int t = 0; t < kDims; ++t) acc[t] += ds * k_tile[r][team_lane + kTeam * t];
    }
  }
  if (!active) return;
  float* dq_row = head_rows(dq, b, seq, heads, h, hd) + i * q_stride;
#pragma unroll
  for (int t = 0; t < kDims; ++t) {
    const int64_t d = team_lane + kTeam * t;
    if (d < hd) dq_row[d] = scale * acc[t];
  }
}

// grid (key tiles, kv_heads, batch): for key j, dv = sum over the group's heads and the queries
// attending j of P dout, dk = scale sum of dS q; each key's sums in (head, query) order.
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_dkdv_kernel(const float* dout, const float* q, const float* k, const float* v,
                      const float* lse, const float* dots, const int32_t* doc_start, float* dk,
                      float* dv, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd,
                      float scale, bool bf16) {
  constexpr int kDims = kHd / kTeam, kInner = kInnerRows<kHd>;
  __shared__ float q_tile[kInner][kHd];
  __shared__ float do_tile[kInner][kHd];
  __shared__ float lse_tile[kInner];
  __shared__ float dot_tile[kInner];
  __shared__ long long start_tile[kInner];
  __shared__ long long query_end;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, group = heads / kv_heads;
  const int64_t c0 = blockIdx.x * int64_t{kRows};
  const int64_t c1 = c0 + kRows < seq ? c0 + kRows : seq;
  const int team_lane = static_cast<int>(threadIdx.x % kTeam);
  const int64_t j = c0 + threadIdx.x / kTeam;
  const bool active = j < seq;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float k_row[kDims], v_row[kDims], dk_acc[kDims], dv_acc[kDims];
  load_row(k_row, kh, j, active, kv_stride, hd, team_lane, bf16);
  load_row(v_row, vh, j, active, kv_stride, hd, team_lane, bf16);
#pragma unroll
  for (int t = 0; t < kDims; ++t) dk_acc[t] = dv_acc[t] = 0.0f;

  // Queries [c0, query_end) can attend keys [c0, c1): with documents, those whose document starts
  // before c1.
  if (threadIdx.x == 0) query_end = doc_start != nullptr ? c0 + 1 : seq;
  __syncthreads();
  if (doc_start != nullptr) {
    long long end = c0 + 1;
    for (int64_t t = c0 + threadIdx.x; t < seq; t += kThreads)
      if (row_start(doc_start, b, seq, t) < c1) end = t + 1;
    atomicMax(&query_end, end);
  }
  __syncthreads();
  const int64_t q_end = query_end;

  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    const float* qh = head_rows(q, b, seq, heads, h, hd);
    const float* doh = head_rows(dout, b, seq, heads, h, hd);
    for (int64_t c = c0; c < q_end; c += kInner) {
      __syncthreads();
      load_tile<kInner>(q_tile, qh, c, seq, q_stride, hd, bf16);
      load_tile<kInner>(do_tile, doh, c, seq, q_stride, hd, bf16);
      if (threadIdx.x < kInner) {
        const int64_t t = c + threadIdx.x;
        const bool present = t < seq;
        lse_tile[threadIdx.x] = present ? lse[(b * heads + h) * seq + t] : 0.0f;
        dot_tile[threadIdx.x] = present ? dots[(b * seq + t) * heads + h] : 0.0f;
        start_tile[threadIdx.x] = present ? row_start(doc_start, b, seq, t) : seq;
      }
      __syncthreads();
      for (int r = 0; r < kInner; ++r) {
        const float score = team_sum(partial_dot(k_row, q_tile, r, team_lane)) * scale;
        const float dp = team_sum(partial_dot(v_row, do_tile, r, team_lane));
        const int64_t t = c + r;  // the query
        const bool attends = active && t < seq && start_tile[r] <= j && j <= t;
        const float p = attends ? expf(score - lse_tile[r]) : 0.0f;
        const float ds = attends ? operand(p * (dp - dot_tile[r]), bf16) : 0.0f;
        const float p_op = operand(p, bf16);
#pragma unroll
        for (int u = 0; u < kDims; ++u) {
          dv_acc[u] += p_op * do_tile[r][team_lane + kTeam * u];
          dk_acc[u] += ds * q_tile[r][team_lane + kTeam * u];
        }
      }
    }
  }
  if (!active) return;
  float* dk_row = head_rows(dk, b, seq, kv_heads, kvh, hd) + j * kv_stride;
  float* dv_row = head_rows(dv, b, seq, kv_heads, kvh, hd) + j * kv_stride;
#pragma unroll
  for (int u = 0; u < kDims; ++u) {
    const int64_t d = team_lane + kTeam * u;
    if (d < hd) {
      dk_row[d] = scale * dk_acc[u];
      dv_row[d] = dv_acc[u];
    }
  }
}

dim3 attention_grid(int64_t seq, int64_t heads, int64_t batch) {
  return dim3(static_cast<unsigned int>((seq + kRows - 1) / kRows),
              static_cast<unsigned int>(heads), static_cast<unsigned int>(batch));
}

float attention_scale(int64_t head_dim) {
  return 1.0f / std::sqrt(static_cast<float>(head_dim));  // as the CPU backend's
}

template <int kHd>
void forward_for(const float* q, const float* k, const float* v, const int32_t* doc_start,
                 float* out, float* lse, int64_t batch, int64_t seq, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, bool bf16, cudaStream_t stream) {
  flash_forward_kernel<kHd><<<attention_grid(seq, heads, batch), kThreads, 0, stream>>>(
      q, k, v, doc_start, out, lse, seq, heads, kv_heads, head_dim, attention_scale(head_dim),
      bf16);
}

template <int kHd>
void backward_for(const float* dout, const float* q, const float* k, const float* v,
                  const float* lse, const float* dots, const int32_t* doc_start, float* dq,
                  float* dk, float* dv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, bool bf16, cudaStream_t stream) {
  const float scale = attention_scale(head_dim);
  flash_dq_kernel<kHd><<<attention_grid(seq, heads, batch), kThreads, 0, stream>>>(
      dout, q, k, v, lse, dots, doc_start, dq, seq, heads, kv_heads, head_dim, scale, bf16);
  flash_dkdv_kernel<kHd><<<attention_grid(seq, kv_heads, batch), kThreads, 0, stream>>>(
      dout, q, k, v, lse, dots, doc_start, dk, dv, seq, heads, kv_heads, head_dim, scale, bf16);
}

}  // namespace

void launch_flash_attention_forward(const float* q, const float* k, const float* v,
                                    const int32_t* doc_start, float* out, float* lse, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                    bool bf16, cudaStream_t stream) {
  if (batch == 0 || seq == 0 || heads == 0) return;
  if (bf16 && head_dim <= kFlashTensorCoreMaxHeadDim)
    return launch_flash_attention_tc_forward(q, k, v, doc_start, out, lse, batch, seq, heads,
                                             kv_heads, head_dim, attention_scale(head_dim), stream);
  with_head_dim_tile<32, 64, 128, kFlashAttentionMaxHeadDim>(head_dim, [&]<int kHd>() {
    forward_for<kHd>(q, k, v, doc_start, out, lse, batch, seq, heads, kv_heads, head_dim, bf16,
                     stream);
  });
}

void launch_flash_attention_backward(const float* dout, const float* q, const float* k,
                                     const float* v, const float* out, const float* lse,
                                     const int32_t* doc_start, float* dq, float* dk, float* dv,
                                     float* row_dots, int64_t batch, int64_t seq, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, bool bf16,
                                     cudaStream_t stream) {
  if (batch == 0 || seq == 0 || heads == 0) return;
  const int64_t rows = batch * seq * heads;
  const int64_t dot_blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  flash_row_dots_kernel<<<row_blocks(dot_blocks), kThreads, 0, stream>>>(dout, out, row_dots, rows,
                                                                         head_dim);
  if (bf16 && head_dim <= kFlashTensorCoreMaxHeadDim)
    return launch_flash_attention_tc_backward(dout, q, k, v, lse, row_dots, doc_start, dq, dk, dv,
                                              batch, seq, heads, kv_heads, head_dim,
                                              attention_scale(head_dim), stream);
  with_head_dim_tile<32, 64, 128, kFlashAttentionMaxHeadDim>(head_dim, [&]<int kHd>() {
    backward_for<kHd>(dout, q, k, v, lse, row_dots, doc_start, dq, dk, dv, batch, seq, heads,
                      kv_heads, head_dim, bf16, stream);
  });
}

}  // namespace moecore::kernels::cuda
