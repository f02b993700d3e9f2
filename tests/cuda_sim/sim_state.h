// cudasim's runtime state as its executor (sim_executor.cpp) and its runtime API
// (sim_runtime.cpp) share it: the device's memory, the streams' work and the errors.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cudasim {

// Where a pointer points: into a device allocation (cudaMalloc, cudaMallocAsync), into host
// memory the device can address (cudaHostAlloc / cudaMallocHost: pinned, mapped), or elsewhere:
// pageable host memory, which no kernel can read. One past an allocation's end counts as inside.
enum class MemoryKind { kDevice, kPinnedHost, kPageableHost };
MemoryKind memory_kind(const void* pointer);
// Whether [pointer, pointer + bytes) lies in one live device allocation.
bool inside_device_allocation(const void* pointer, size_t bytes);

// Memory another part of cudasim mapped (NCCL's symmetric memory, nccl_sim.cpp), entered as a
// device allocation of `bytes` (filled with 0xff, as fresh memory is), and taken out again.
void register_device_memory(void* pointer, size_t bytes);
void unregister_device_memory(void* pointer);

// Runs `work` now, or records it when `stream` is being captured (launches, copies, sets, host
// functions, CUB's sort all go through here).
void issue_stream_work(cudaStream_t stream, std::function<void()> work);

// An error of the last call (cudaGetLastError returns and clears it) or, when sticky, of the
// context: no more work runs, and every later wait returns it (a kernel's fault, as on the
// device). A sticky error reaches the host as a fault does on the device, where the kernel runs
// after its launch returned: at the next wait (wait_for_device), not at the launch's own
// cudaGetLastError check, which sees it only after a wait. The message goes to stderr, since the
// status alone would not say which kernel.
void record_error(cudaError_t error, bool sticky, const std::string& message);
bool has_sticky_error();
// A wait for the device (a stream's, an event's, the device's synchronisation): the sticky error,
// from now on also cudaGetLastError's.
cudaError_t wait_for_device();
// Forgets the errors, a sticky one included: the emulator's own tests (test_emulator.cpp) fail
// launches on purpose and go on, as a process would after cudaDeviceReset.
void clear_errors();

// The dynamic shared memory a kernel may use (cudaFuncSetAttribute), 48 KiB unless raised.
size_t max_dynamic_shared_bytes(const void* kernel);

// The emulated device's limits (an H200's; a B200's are the same).
inline constexpr size_t kDefaultSharedBytes = 48 * 1024;
inline constexpr size_t kOptInSharedBytes = 227 * 1024;

// The emulated device's compute capability (major): 9, an H200 (sm_90), unless the environment
// says CUDASIM_ARCH=sm_100: 10, a B200, whose MX tensor cores cuBLASLt's block-scaled GEMMs run
// on (cublas_sim.cpp); such a process says on stderr at exit how many ran. Any other value of
// CUDASIM_ARCH ends the process in one line.
int compute_capability_major();

// cuBLASLt's block-scaled GEMMs (cublas_sim.cpp): where the scale of row `row`, block `block`
// along k, of an operand with `blocks` blocks lies in the tiled layout the cuBLAS documentation
// gives ("1D Block Scaling Factors Layout": tiles of 128 rows x 4 blocks, 512 bytes), its size
// for `rows` rows (padded to 128 rows and 4 blocks), and how many such GEMMs have run.
int64_t block_scale_offset(int64_t row, int64_t block, int64_t blocks);
int64_t block_scale_bytes(int64_t rows, int64_t blocks);
int64_t block_scaled_gemms_run();

// Runs every block of a launch whose checks passed (sim_executor.cpp); false and `failure` set
// when a block's threads did not all reach a barrier or collective together.
bool execute_launch(const LaunchShape& shape, const std::function<void()>& body,
                    std::string& failure);

}  // namespace cudasim
