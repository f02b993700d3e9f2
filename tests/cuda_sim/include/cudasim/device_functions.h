// cudasim: what device code sees (included by cuda_runtime.h): the thread's coordinates, the
// block's barrier, the warp's collectives, atomics and the arithmetic intrinsics. The coordinates
// and collectives are those of the fiber running (sim_executor.cpp).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace cudasim {

// The running CUDA thread's coordinates and its launch's shape.
struct ThreadCoordinates {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
const ThreadCoordinates& coordinates();
// The dynamic shared memory of the running launch (its third launch argument, in bytes).
void* dynamic_shared_memory();

// A warp collective: this lane offers `bits` and gets those of `source_lane` (its own where the
// collective gives it its own value) once every lane of `mask` has arrived at the same kind of
// collective.
enum class WarpCollective { kShuffle, kSyncWarp };
uint64_t warp_exchange(WarpCollective collective, unsigned int mask, uint64_t bits,
                       int source_lane);
int lane_id();

// A rule of the device broken by the running thread (a misaligned WMMA pointer, say): the launch
// fails with `what` once its block has run.
void report_fault(const std::string& what);

// A __shared__ object's declaration reached by a thread of the running block (rewrite_launches
// adds the call after each): the first thread of the block fills it with 0xff, the device's
// garbage, and its bytes count against the block's shared memory limit with the dynamic ones.
void declare_shared(void* object, size_t bytes, const char* name);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

}  // namespace cudasim

#define threadIdx (::cudasim::coordinates().thread_idx)
#define blockIdx (::cudasim::coordinates().block_idx)
#define blockDim (::cudasim::coordinates().block_dim)
#define gridDim (::cudasim::coordinates().grid_dim)
inline constexpr int warpSize = 32;

// Every thread of the block, at the same call: a barrier reached by some threads while others
// wait at another barrier or a warp collective, or have exited, is reported as the launch's
// failure (the hardware's behaviour there is undefined). The call is known by its source line,
// which the optimiser cannot duplicate as it may duplicate a call's return address.
namespace cudasim {
void sync_threads(const char* file, int line);
}
#define __syncthreads() ::cudasim::sync_threads(__FILE__, __LINE__)
void __syncwarp(unsigned int mask = 0xffffffffu);
// Memory fences order a thread's writes for other threads and the host; one host thread runs
// every fiber here, so its writes are already in order.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

// The shuffles, with the CUDA programming guide's source lanes and widths.
template <typename T>
T __shfl_sync(unsigned int mask, T v, int source_lane, int width = 32) {
  const int lane = cudasim::lane_id();
  // The hardware takes the source's low bits within the lane's group of `width` (a power of two).
  const int source = (lane / width) * width + (source_lane & (width - 1));
  return cudasim::from_bits<T>(
      cudasim::warp_exchange(cudasim::WarpCollective::kShuffle, mask, cudasim::to_bits(v), source));
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
  const int lane = cudasim::lane_id();
  int source = lane ^ (lane_mask & 31);
  if (source >= (lane / width + 1) * width) source = lane;  // a later group: its own value
  return cudasim::from_bits<T>(
      cudasim::warp_exchange(cudasim::WarpCollective::kShuffle, mask, cudasim::to_bits(v), source));
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
  const int lane = cudasim::lane_id();
  const int source = lane % width < static_cast<int>(delta) ? lane : lane - static_cast<int>(delta);
  return cudasim::from_bits<T>(
      cudasim::warp_exchange(cudasim::WarpCollective::kShuffle, mask, cudasim::to_bits(v), source));
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
  const int lane = cudasim::lane_id();
  const int source =
      lane % width + static_cast<int>(delta) >= width ? lane : lane + static_cast<int>(delta);
  return cudasim::from_bits<T>(
      cudasim::warp_exchange(cudasim::WarpCollective::kShuffle, mask, cudasim::to_bits(v), source));
}

// Atomics: the fibers of a launch share one host thread and switch only at barriers and
// collectives, so a read-modify-write is atomic as it stands.
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  const T old = *address;
  if (value < old) *address = value;
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <typename T>
T atomicExch(T* address, T value) {
  const T old = *address;
  *address = value;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}

// Arithmetic intrinsics: round-to-nearest-even fp32 operations (the test target compiles with
// -ffp-contract=off, so none is fused into an FMA the device would not use) and bit casts.
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return sqrtf(a);
}
inline float __frcp_rn(float a) {
  return 1.0f / a;
}
inline float __fmaf_rn(float a, float b, float c) {
  return fmaf(a, b, c);
}
inline unsigned int __float_as_uint(float v) {
  return std::bit_cast<unsigned int>(v);
}
inline float __uint_as_float(unsigned int v) {
  return std::bit_cast<float>(v);
}
inline int __float_as_int(float v) {
  return std::bit_cast<int>(v);
}
inline float __int_as_float(int v) {
  return std::bit_cast<float>(v);
}
inline int __clz(int v) {
  return std::countl_zero(static_cast<unsigned int>(v));
}
inline int __clzll(long long v) {
  return std::countl_zero(static_cast<unsigned long long>(v));
}
inline int __popc(unsigned int v) {
  return std::popcount(v);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
