// Flash attention in bf16 on tensor cores (WMMA, 16 x 16 x 16 bf16 fragments with fp32
// accumulators), for head dimensions up to kFlashTensorCoreMaxHeadDim. The same algorithm, masks
// and rounding as flash_attention.cu's kernels, which remain the fp32 path and bf16's beyond that
// head dimension: only the order of each fp32 sum differs. Those kernels sum every product on the
// CUDA cores; at the GPU benchmark's shape (bench/configs/gpu.toml: 2048 positions, head dim 128)
// attention is an eighth of the model's FLOPs and, on the CUDA cores, most of its time.
//
// A block has four warps and owns 64 rows (queries in the forward and dq, keys in dk/dv), 16 per
// warp: one fragment row. The warp's own operands (q and dout, or k and v) stay in registers as
// A fragments; the other side streams through shared memory in tiles of 64 rows, converted to bf16
// on the way in. A warp's scores come out of the tensor cores into its strip of shared memory
// (fragments' element layout is the hardware's, unknown to the code), where two lanes per row
// apply the mask and the softmax, each over 32 of the tile's columns; the bf16 P or dS they make
// goes to the warp's rows of a bf16 strip and back into the tensor cores as an A fragment. The
// probabilities are normalised (P = exp(score - lse), lse from a first sweep), as in
// flash_attention.cu, so no accumulator is ever rescaled and bf16 rounds the operands the CPU
// backend rounds. Sums run in a fixed order (no float atomics): results do not depend on
// scheduling. 16-key (or 16-query) parts of a tile that no row of the warp can attend under the
// causal mask are skipped.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kFrag = 16;                 // the fragments' edge
constexpr int kOwnRows = kFrag * kWarps;  // rows a block owns: 64
constexpr int kInner = 64;                // rows per streamed tile
constexpr int kSubTiles = kInner / kFrag;
constexpr int kHalfCols = kInner / 2;   // a lane's columns of its row of a strip
constexpr int kStripLd = kInner + 4;    // floats per strip row (272 bytes: 16-byte multiple)
constexpr int kWeightsLd = kInner + 8;  // bf16 per row of P or dS (144 bytes)
constexpr size_t kStripBytes = size_t{kOwnRows} * kStripLd * sizeof(float);
constexpr size_t kWeightsBytes = size_t{kOwnRows} * kWeightsLd * sizeof(__nv_bfloat16);

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major>;
using FragBRow =
    wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major>;
using FragBCol =
    wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// The shared memory of a kernel, carved from one dynamic allocation (aligned to 128 bytes by the
// device; every part's size is a multiple of 128). Operand tiles: bf16 [rows][kLd], the 8 extra
// elements keep WMMA's 32-byte alignment of every 16th row and move rows to other banks.
template <int kHd>
struct Shared {
  static constexpr int kLd = kHd + 8;
  static constexpr size_t kTileBytes = size_t{kInner} * kLd * sizeof(__nv_bfloat16);
  static_assert(kHd % kFrag == 0 && kTileBytes % 128 == 0 && kStripBytes % 128 == 0 &&
                kWeightsBytes % 128 == 0);
  // Two operand tiles, `strips` fp32 strips, `weights` bf16 weight strips and `stats` bytes of
  // per-row values, in that order.
  static constexpr size_t bytes(int strips, int weights, size_t stats) {
    return 2 * kTileBytes + static_cast<size_t>(strips) * kStripBytes +
           static_cast<size_t>(weights) * kWeightsBytes + stats;
  }
};

struct alignas(128) SharedLine {
  unsigned char bytes[128];
};

// A kernel's shared memory (Shared<kHd>::bytes(strip_count, weight_count, stats)) in its parts,
// and this warp's rows of the strips and weights.
template <int kHd>
struct Carved {
  __device__ Carved(SharedLine* lines, int strip_count, int weight_count) {
    unsigned char* base = lines[0].bytes;
    const size_t tile = Shared<kHd>::kTileBytes;
    tile_a = reinterpret_cast<__nv_bfloat16*>(base);
    tile_b = reinterpret_cast<__nv_bfloat16*>(base + tile);
    strips = reinterpret_cast<float*>(base + 2 * tile);
    weights = reinterpret_cast<__nv_bfloat16*>(base + 2 * tile + strip_count * kStripBytes);
    stats = base + 2 * tile + strip_count * kStripBytes + weight_count * kWeightsBytes;
  }
  // The warp's 16 rows of fp32 strip `part`, and of bf16 weights `part`.
  __device__ float* strip(int part, int warp) const {
    return strips + (part * kOwnRows + kFrag * warp) * kStripLd;
  }
  __device__ __nv_bfloat16* weight_rows(int part, int warp) const {
    return weights + (part * kOwnRows + kFrag * warp) * kWeightsLd;
  }
  __nv_bfloat16 *tile_a, *tile_b;
  float* strips;
  __nv_bfloat16* weights;
  unsigned char* stats;
};

// Where a lane works in its block: the block owns rows [first, end) (queries, or keys in dk/dv),
// the lane's warp rows [w0, w0 + 16), the lane row w0 + r (r = lane / 2) and half of that row's
// columns in the strips (half = lane % 2). The two lanes of a row walk their 32 columns each from
// a start of their own (rotation), so that the 32 lanes' reads of a strip (rows 68 floats apart)
// fall in 32 different banks.
struct LanePlace {
  int warp, r, half, rotation;
  int64_t first, end, w0;
};

__device__ inline LanePlace lane_place(int64_t seq) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int half = lane % 2;
  const int64_t first = blockIdx.x * int64_t{kOwnRows};
  return {warp,
          lane / 2,
          half,
          half | ((lane >> 3) & 2),
          first,
          first + kOwnRows < seq ? first + kOwnRows : seq,
          first + kFrag * warp};
}

// tile[r][d] = bf16 of rows first + r (r < rows) of a [seq, row_stride] fp32 matrix at base,
// dimensions d < hd; 0 past the sequence and past hd. Every thread of the block takes part; the
// caller puts the barriers around it. vec4: 16-byte loads of 4 dimensions (hd and row_stride
// multiples of 4, base 16-byte aligned: the launch checks).
template <int kHd>
__device__ void load_operands(__nv_bfloat16* tile, const float* base, int64_t first, int rows,
                              int64_t seq, int64_t row_stride, int64_t hd, bool vec4) {
  constexpr int kLd = Shared<kHd>::kLd;
  if (vec4) {
    constexpr int kQuads = kHd / 4;
    for (int idx = static_cast<int>(threadIdx.x); idx < rows * kQuads; idx += kThreads) {
      const int r = idx / kQuads, d = (idx % kQuads) * 4;
      const int64_t row = first + r;
      float4 x{0.0f, 0.0f, 0.0f, 0.0f};
      if (row < seq && d < hd) x = *reinterpret_cast<const float4*>(base + row * row_stride + d);
      __nv_bfloat16* out = tile + r * kLd + d;
      out[0] = __float2bfloat16_rn(x.x);
      out[1] = __float2bfloat16_rn(x.y);
      out[2] = __float2bfloat16_rn(x.z);
      out[3] = __float2bfloat16_rn(x.w);
    }
    return;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * kHd; idx += kThreads) {
    const int r = idx / kHd, d = idx % kHd;
    const int64_t row = first + r;
    tile[r * kLd + d] =
        __float2bfloat16_rn(row < seq && d < hd ? base[row * row_stride + d] : 0.0f);
  }
}

// The warp's 16 rows of a staged operand tile as A fragments, one per 16 dimensions.
template <int kHd>
__device__ void load_own(FragA (&frags)[kHd / kFrag], const __nv_bfloat16* tile, int warp) {
#pragma unroll
  for (int dd = 0; dd < kHd / kFrag; ++dd)
    wmma::load_matrix_sync(frags[dd], tile + warp * kFrag * Shared<kHd>::kLd + dd * kFrag,
                           Shared<kHd>::kLd);
}

// strip[r][16 n + c] = own row r . tile row 16 n + c, for the sub-tiles first <= n < live: the
// warp's 16 x 64 products of its own rows with the streamed tile's.
template <int kHd>
__device__ void products(const FragA (&own)[kHd / kFrag], const __nv_bfloat16* tile, float* strip,
                         int first, int live) {
  for (int n = first; n < live; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int dd = 0; dd < kHd / kFrag; ++dd) {
      FragBCol other;  // B[d][c] = tile[16 n + c][d]
      wmma::load_matrix_sync(other, tile + n * kFrag * Shared<kHd>::kLd + dd * kFrag,
                             Shared<kHd>::kLd);
      wmma::mma_sync(acc, own[dd], other, acc);
    }
    wmma::store_matrix_sync(strip + n * kFrag, acc, kStripLd, wmma::mem_row_major);
  }
}

// acc[dd] += weights (the warp's 16 x 64 bf16 P or dS) x tile rows (64 x kHd), over the
// sub-tiles first <= n < live.
template <int kHd>
__device__ void accumulate(FragC (&acc)[kHd / kFrag], const __nv_bfloat16* weights,
                           const __nv_bfloat16* tile, int first, int live) {
  for (int n = first; n < live; ++n) {
    FragA w;
    wmma::load_matrix_sync(w, weights + n * kFrag, kWeightsLd);
#pragma unroll
    for (int dd = 0; dd < kHd / kFrag; ++dd) {
      FragBRow rows;  // B[c][d] = tile[16 n + c][d]
      wmma::load_matrix_sync(rows, tile + n * kFrag * Shared<kHd>::kLd + dd * kFrag,
                             Shared<kHd>::kLd);
      wmma::mma_sync(acc[dd], w, rows, acc[dd]);
    }
  }
}

// out rows first + r (r < 16, row < seq) = factor acc through the warp's strip, 64 columns at a
// time.
template <int kHd>
__device__ void store_rows(const FragC (&acc)[kHd / kFrag], float* strip, float* out, int64_t first,
                           int64_t seq, int64_t row_stride, int64_t hd, float factor) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int d0 = 0; d0 < kHd; d0 += kInner) {
    const int frags = (kHd - d0 < kInner ? kHd - d0 : kInner) / kFrag;
    for (int f = 0; f < frags; ++f)
      wmma::store_matrix_sync(strip + f * kFrag, acc[d0 / kFrag + f], kStripLd,
                              wmma::mem_row_major);
    __syncwarp();
    // Row by row, lane l writes columns l and l + 32: 128-byte runs.
    for (int r = 0; r < kFrag && first + r < seq; ++r)
      for (int c = lane; c < frags * kFrag; c += 32) {
        const int64_t d = d0 + c;
        if (d < hd) out[(first + r) * row_stride + d] = factor * strip[r * kStripLd + c];
      }
    __syncwarp();
  }
}

// The number of 16-row sub-tiles of the tile at `first` holding a row at or before `last`.
__device__ inline int sub_tiles_through(int64_t first, int64_t last) {
  if (last < first) return 0;
  const int64_t n = (last - first) / kFrag + 1;
  return n < kSubTiles ? static_cast<int>(n) : kSubTiles;
}

// The block's first key: the earliest document start among its query rows [r0, r1), 0 without
// documents. Every thread calls it; `slots` holds kWarps ints of shared memory.
__device__ int64_t block_first_key(const int32_t* doc_start, int64_t b, int64_t seq, int64_t r0,
                                   int64_t r1, int* slots) {
  if (doc_start == nullptr) return 0;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  int first = static_cast<int>(r1);
  for (int64_t t = r0 + lane + 32 * warp; t < r1; t += kThreads) {
    const int s = static_cast<int>(row_start(doc_start, b, seq, t));
    first = s < first ? s : first;
  }
  for (int step = 16; step > 0; step /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, first, step);
    first = other < first ? other : first;
  }
  __syncthreads();  // earlier readers of slots are done
  if (lane == 0) slots[warp] = first;
  __syncthreads();
  int block_first = slots[0];
  for (int w = 1; w < kWarps; ++w) block_first = slots[w] < block_first ? slots[w] : block_first;
  return block_first;
}

// grid (query tiles of 64, heads, batch). q, out: [B, T, heads, hd]; k, v: [B, T, kv_heads, hd];
// lse: [B, heads, T].
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_forward_tc_kernel(const float* q, const float* k, const float* v,
                            const int32_t* doc_start, float* out, float* lse, int64_t seq,
                            int64_t heads, int64_t kv_heads, int64_t hd, float scale, bool vec4) {
  extern __shared__ SharedLine forward_shared[];
  const Carved<kHd> shared(forward_shared, 1, 1);
  __nv_bfloat16 *k_tile = shared.tile_a, *v_tile = shared.tile_b;
  auto* slots = reinterpret_cast<int*>(shared.stats);

  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (heads / kv_heads);
  const auto [warp, r, half, rotation, r0, r1, w0] = lane_place(seq);  // own rows: queries
  const int64_t w_last = w0 + kFrag - 1 < seq - 1 ? w0 + kFrag - 1 : seq - 1;
  const int64_t i = w0 + r;
  const bool active = i < seq;
  // Keys [lo, hi] of this lane's row; none for a row past the sequence.
  const int64_t lo = active ? row_start(doc_start, b, seq, i) : 1, hi = active ? i : 0;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* qh = head_rows(q, b, seq, heads, h, hd);
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float* strip = shared.strip(0, warp);
  __nv_bfloat16* weights = shared.weight_rows(0, warp);

  FragA q_frags[kHd / kFrag];
  load_operands<kHd>(k_tile, qh, r0, kOwnRows, seq, q_stride, hd, vec4);  // q, staged
  __syncthreads();
  load_own<kHd>(q_frags, k_tile, warp);
  const int64_t c_lo = block_first_key(doc_start, b, seq, r0, r1, slots);  // has barriers

  // Sweep 1: each lane's running max m and sum l over its columns, then the row's pair combined.
  float m = -INFINITY, l = 0.0f;
  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();  // the previous tile's readers are done
    load_operands<kHd>(k_tile, kh, c, kInner, seq, kv_stride, hd, vec4);
    __syncthreads();
    const int live = w0 < seq ? sub_tiles_through(c, w_last) : 0;
    if (live == 0) continue;  // warp-uniform
    products<kHd>(q_frags, k_tile, strip, 0, live);
    __syncwarp();
    for (int t = 0; t < kHalfCols; ++t) {
      const int col = half * kHalfCols + (t + rotation) % kHalfCols;
      const int64_t j = c + col;
      if (j < lo || j > hi) continue;
      const float score = strip[r * kStripLd + col] * scale;
      if (score > m) {
        l = l * expf(m - score) + 1.0f;
        m = score;
      } else {
        l += expf(score - m);
      }
    }
    __syncwarp();
  }
  // The pair's halves: each lane adds the same two terms (in either order: the same bits).
  const float m_other = __shfl_xor_sync(0xffffffffu, m, 1);
  const float l_other = __shfl_xor_sync(0xffffffffu, l, 1);
  const float row_max = m > m_other ? m : m_other;
  const float mine = m == -INFINITY ? 0.0f : l * expf(m - row_max);
  const float theirs = m_other == -INFINITY ? 0.0f : l_other * expf(m_other - row_max);
  const float row_lse = row_max + logf(mine + theirs);  // >= 1 term: a row attends itself

  // Sweep 2: out = sum over keys of P v, P = bf16(exp(score - lse)).
  FragC acc[kHd / kFrag];
#pragma unroll
  for (int dd = 0; dd < kHd / kFrag; ++dd) wmma::fill_fragment(acc[dd], 0.0f);
  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();
    load_operands<kHd>(k_tile, kh, c, kInner, seq, kv_stride, hd, vec4);
    load_operands<kHd>(v_tile, vh, c, kInner, seq, kv_stride, hd, vec4);
    __syncthreads();
    const int live = w0 < seq ? sub_tiles_through(c, w_last) : 0;
    if (live == 0) continue;
    products<kHd>(q_frags, k_tile, strip, 0, live);
    __syncwarp();
    for (int t = 0; t < kHalfCols; ++t) {
      const int col = half * kHalfCols + (t + rotation) % kHalfCols;
      const int64_t j = c + col;
      const float p = j >= lo && j <= hi ? expf(strip[r * kStripLd + col] * scale - row_lse) : 0.0f;
      weights[r * kWeightsLd + col] = __float2bfloat16_rn(p);
    }
    __syncwarp();
    accumulate<kHd>(acc, weights, v_tile, 0, live);
    __syncwarp();
  }
  if (active && half == 0) lse[(b * heads + h) * seq + i] = row_lse;
  if (w0 < seq)
    store_rows<kHd>(acc, strip, head_rows(out, b, seq, heads, h, hd), w0, seq, q_stride, hd, 1.0f);
}

// grid (query tiles of 64, heads, batch): dq = scale sum over keys of dS k, dS = bf16(P (dP - D)),
// P = exp(score - lse), dP = dout . v.
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_dq_tc_kernel(const float* dout, const float* q, const float* k, const float* v,
                       const float* lse, const float* dots, const int32_t* doc_start, float* dq,
                       int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd, float scale,
                       bool vec4) {
  extern __shared__ SharedLine dq_shared[];
  const Carved<kHd> shared(dq_shared, 2, 1);
  __nv_bfloat16 *k_tile = shared.tile_a, *v_tile = shared.tile_b;
  auto* slots = reinterpret_cast<int*>(shared.stats);

  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (heads / kv_heads);
  const auto [warp, r, half, rotation, r0, r1, w0] = lane_place(seq);  // own rows: queries
  const int64_t w_last = w0 + kFrag - 1 < seq - 1 ? w0 + kFrag - 1 : seq - 1;
  const int64_t i = w0 + r;
  const bool active = i < seq;
  const int64_t lo = active ? row_start(doc_start, b, seq, i) : 1, hi = active ? i : 0;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* qh = head_rows(q, b, seq, heads, h, hd);
  const float* doh = head_rows(dout, b, seq, heads, h, hd);
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float *score_strip = shared.strip(0, warp), *dp_strip = shared.strip(1, warp);
  __nv_bfloat16* ds_weights = shared.weight_rows(0, warp);
  const float row_lse = active ? lse[(b * heads + h) * seq + i] : 0.0f;
  const float row_dot = active ? dots[(b * seq + i) * heads + h] : 0.0f;

  FragA q_frags[kHd / kFrag], do_frags[kHd / kFrag];
  load_operands<kHd>(k_tile, qh, r0, kOwnRows, seq, q_stride, hd, vec4);
  load_operands<kHd>(v_tile, doh, r0, kOwnRows, seq, q_stride, hd, vec4);
  __syncthreads();
  load_own<kHd>(q_frags, k_tile, warp);
  load_own<kHd>(do_frags, v_tile, warp);
  const int64_t c_lo = block_first_key(doc_start, b, seq, r0, r1, slots);

  FragC acc[kHd / kFrag];
#pragma unroll
  for (int dd = 0; dd < kHd / kFrag; ++dd) wmma::fill_fragment(acc[dd], 0.0f);
  for (int64_t c = c_lo; c < r1; c += kInner) {
    __syncthreads();
    load_operands<kHd>(k_tile, kh, c, kInner, seq, kv_stride, hd, vec4);
    load_operands<kHd>(v_tile, vh, c, kInner, seq, kv_stride, hd, vec4);
    __syncthreads();
    const int live = w0 < seq ? sub_tiles_through(c, w_last) : 0;
    if (live == 0) continue;
    products<kHd>(q_frags, k_tile, score_strip, 0, live);
    products<kHd>(do_frags, v_tile, dp_strip, 0, live);
    __syncwarp();
    for (int t = 0; t < kHalfCols; ++t) {
      const int col = half * kHalfCols + (t + rotation) % kHalfCols;
      const int64_t j = c + col;
      const float ds = j >= lo && j <= hi
                           ? expf(score_strip[r * kStripLd + col] * scale - row_lse) *
                                 (dp_strip[r * kStripLd + col] - row_dot)
                           : 0.0f;
      ds_weights[r * kWeightsLd + col] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    accumulate<kHd>(acc, ds_weights, k_tile, 0, live);
    __syncwarp();
  }
  if (w0 < seq)
    store_rows<kHd>(acc, score_strip, head_rows(dq, b, seq, heads, h, hd), w0, seq, q_stride, hd,
                    scale);
}

// The first 16-query sub-tile of the tile at `first` holding a query at or after `key` (the
// causal mask: no earlier query attends it); kSubTiles if none does.
__device__ inline int first_sub_tile_from(int64_t first, int64_t key) {
  if (key <= first) return 0;
  const int64_t n = (key - first) / kFrag;
  return n < kSubTiles ? static_cast<int>(n) : kSubTiles;
}

// grid (key tiles of 64, kv_heads, batch): for key j, dv = sum over the group's heads and the
// queries attending j of P dout, dk = scale sum of dS q; each key's sums in (head, query) order.
template <int kHd>
__global__ void __launch_bounds__(kThreads)
    flash_dkdv_tc_kernel(const float* dout, const float* q, const float* k, const float* v,
                         const float* lse, const float* dots, const int32_t* doc_start, float* dk,
                         float* dv, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd,
                         float scale, bool vec4) {
  extern __shared__ SharedLine dkdv_shared[];
  const Carved<kHd> shared(dkdv_shared, 2, 2);
  __nv_bfloat16 *q_tile = shared.tile_a, *do_tile = shared.tile_b;
  auto* lse_tile = reinterpret_cast<float*>(shared.stats);
  auto* dot_tile = lse_tile + kInner;
  auto* start_tile = reinterpret_cast<int*>(dot_tile + kInner);
  auto* query_end = start_tile + kInner;

  const int64_t b = blockIdx.z, kvh = blockIdx.y, group = heads / kv_heads;
  const auto [warp, r, half, rotation, c0, c1, w0] = lane_place(seq);  // own rows: keys
  const int64_t j = w0 + r;
  const bool active = j < seq;
  const int64_t q_stride = heads * hd, kv_stride = kv_heads * hd;
  const float* kh = head_rows(k, b, seq, kv_heads, kvh, hd);
  const float* vh = head_rows(v, b, seq, kv_heads, kvh, hd);
  float *score_strip = shared.strip(0, warp), *dp_strip = shared.strip(1, warp);
  __nv_bfloat16 *p_weights = shared.weight_rows(0, warp), *ds_weights = shared.weight_rows(1, warp);

  FragA k_frags[kHd / kFrag], v_frags[kHd / kFrag];
  load_operands<kHd>(q_tile, kh, c0, kOwnRows, seq, kv_stride, hd, vec4);
  load_operands<kHd>(do_tile, vh, c0, kOwnRows, seq, kv_stride, hd, vec4);
  // Queries [c0, query_end) can attend keys [c0, c1): with documents, those whose document starts
  // before c1.
  if (threadIdx.x == 0) *query_end = static_cast<int>(doc_start != nullptr ? c0 + 1 : seq);
  __syncthreads();
  load_own<kHd>(k_frags, q_tile, warp);
  load_own<kHd>(v_frags, do_tile, warp);
  if (doc_start != nullptr) {
    int end = static_cast<int>(c0 + 1);
    for (int64_t t = c0 + threadIdx.x; t < seq; t += kThreads)
      if (row_start(doc_start, b, seq, t) < c1) end = static_cast<int>(t + 1);
    atomicMax(query_end, end);
  }
  __syncthreads();
  const int64_t q_end = *query_end;

  FragC dk_acc[kHd / kFrag], dv_acc[kHd / kFrag];
#pragma unroll
  for (int dd = 0; dd < kHd / kFrag; ++dd) {
    wmma::fill_fragment(dk_acc[dd], 0.0f);
    wmma::fill_fragment(dv_acc[dd], 0.0f);
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    const float* qh = head_rows(q, b, seq, heads, h, hd);
    const float* doh = head_rows(dout, b, seq, heads, h, hd);
    for (int64_t c = c0; c < q_end; c += kInner) {
      __syncthreads();
      load_operands<kHd>(q_tile, qh, c, kInner, seq, q_stride, hd, vec4);
      load_operands<kHd>(do_tile, doh, c, kInner, seq, q_stride, hd, vec4);
      if (threadIdx.x < kInner) {
        const int64_t t = c + threadIdx.x;
        const bool present = t < seq;
        lse_tile[threadIdx.x] = present ? lse[(b * heads + h) * seq + t] : 0.0f;
        dot_tile[threadIdx.x] = present ? dots[(b * seq + t) * heads + h] : 0.0f;
        start_tile[threadIdx.x] = static_cast<int>(present ? row_start(doc_start, b, seq, t) : seq);
      }
      __syncthreads();
      // Sub-tiles before the warp's first key, and past the sequence, hold no attending query.
      const int first = first_sub_tile_from(c, w0);
      const int live = sub_tiles_through(c, seq - 1);
      if (w0 >= seq || first >= live) continue;  // warp-uniform
      products<kHd>(k_frags, q_tile, score_strip, first, live);
      products<kHd>(v_frags, do_tile, dp_strip, first, live);
      __syncwarp();
      for (int u = 0; u < kHalfCols; ++u) {
        const int col = half * kHalfCols + (u + rotation) % kHalfCols;
        const int64_t t = c + col;  // the query
        const bool attends = active && t < seq && start_tile[col] <= j && j <= t;
        const float p =
            attends ? expf(score_strip[r * kStripLd + col] * scale - lse_tile[col]) : 0.0f;
        const float ds = attends ? p * (dp_strip[r * kStripLd + col] - dot_tile[col]) : 0.0f;
        p_weights[r * kWeightsLd + col] = __float2bfloat16_rn(p);
        ds_weights[r * kWeightsLd + col] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      accumulate<kHd>(dv_acc, p_weights, do_tile, first, live);
      accumulate<kHd>(dk_acc, ds_weights, q_tile, first, live);
      __syncwarp();
    }
  }
  if (w0 >= seq) return;  // no barrier follows
  store_rows<kHd>(dk_acc, score_strip, head_rows(dk, b, seq, kv_heads, kvh, hd), w0, seq, kv_stride,
                  hd, scale);
  store_rows<kHd>(dv_acc, score_strip, head_rows(dv, b, seq, kv_heads, kvh, hd), w0, seq, kv_stride,
                  hd, 1.0f);
}

// Whether the operands can be read 4 floats at a time: 16-byte aligned, rows of a multiple of 4.
bool quad_loads(int64_t head_dim, std::initializer_list<const float*> operands) {
  if (head_dim % 4 != 0) return false;
  for (const float* p : operands)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

dim3 tile_grid(int64_t seq, int64_t heads, int64_t batch) {
  return dim3(static_cast<unsigned int>((seq + kOwnRows - 1) / kOwnRows),
              static_cast<unsigned int>(heads), static_cast<unsigned int>(batch));
}

constexpr size_t kSlotBytes = 128;      // block_first_key's kWarps ints
constexpr size_t kStatBytes = 7 * 128;  // dk/dv's lse, dots and starts per query, and query_end

template <int kHd>
void forward_for(const float* q, const float* k, const float* v, const int32_t* doc_start,
                 float* out, float* lse, int64_t batch, int64_t seq, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, float scale, cudaStream_t stream) {
  const size_t bytes = Shared<kHd>::bytes(1, 1, kSlotBytes);
  if (!allow_dynamic_shared(flash_forward_tc_kernel<kHd>, bytes)) return;
  flash_forward_tc_kernel<kHd><<<tile_grid(seq, heads, batch), kThreads, bytes, stream>>>(
      q, k, v, doc_start, out, lse, seq, heads, kv_heads, head_dim, scale,
      quad_loads(head_dim, {q, k, v}));
}

template <int kHd>
void backward_for(const float* dout, const float* q, const float* k, const float* v,
                  const float* lse, const float* dots, const int32_t* doc_start, float* dq,
                  float* dk, float* dv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, float scale, cudaStream_t stream) {
  const bool vec4 = quad_loads(head_dim, {dout, q, k, v});
  const size_t dq_bytes = Shared<kHd>::bytes(2, 1, kSlotBytes);
  if (!allow_dynamic_shared(flash_dq_tc_kernel<kHd>, dq_bytes)) return;
  flash_dq_tc_kernel<kHd><<<tile_grid(seq, heads, batch), kThreads, dq_bytes, stream>>>(
      dout, q, k, v, lse, dots, doc_start, dq, seq, heads, kv_heads, head_dim, scale, vec4);
  const size_t dkdv_bytes = Shared<kHd>::bytes(2, 2, kStatBytes);
  if (!allow_dynamic_shared(flash_dkdv_tc_kernel<kHd>, dkdv_bytes)) return;
  flash_dkdv_tc_kernel<kHd><<<tile_grid(seq, kv_heads, batch), kThreads, dkdv_bytes, stream>>>(
      dout, q, k, v, lse, dots, doc_start, dk, dv, seq, heads, kv_heads, head_dim, scale, vec4);
}

}  // namespace

void launch_flash_attention_tc_forward(const float* q, const float* k, const float* v,
                                       const int32_t* doc_start, float* out, float* lse,
                                       int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                       int64_t head_dim, float scale, cudaStream_t stream) {
  with_head_dim_tile<32, 64, kFlashTensorCoreMaxHeadDim>(head_dim, [&]<int kHd>() {
    forward_for<kHd>(q, k, v, doc_start, out, lse, batch, seq, heads, kv_heads, head_dim, scale,
                     stream);
  });
}

void launch_flash_attention_tc_backward(const float* dout, const float* q, const float* k,
                                        const float* v, const float* lse, const float* row_dots,
                                        const int32_t* doc_start, float* dq, float* dk, float* dv,
                                        int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                        int64_t head_dim, float scale, cudaStream_t stream) {
  with_head_dim_tile<32, 64, kFlashTensorCoreMaxHeadDim>(head_dim, [&]<int kHd>() {
    backward_for<kHd>(dout, q, k, v, lse, row_dots, doc_start, dq, dk, dv, batch, seq, heads,
                      kv_heads, head_dim, scale, stream);
  });
}

}  // namespace moecore::kernels::cuda
