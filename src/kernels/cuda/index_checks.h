// The CUDA backend's check of row numbers and token ids held in device memory. The CPU backend
// rejects an index outside its tensor before computing; here the indices are on the device, and
// looking at them from the host would make every operation that takes them wait for the stream
// (four such per MoE layer and pass). So the check is queued with the operation instead: kernels
// find the first such index and, unless an earlier operation's error is already pending, record
// it in host memory the device writes; the operation's own kernels leave such rows alone (NaN, or
// nothing written). synchronize() (runtime.h), the next time the host waits for the stream,
// throws the pending error, naming the operation where it arose:
//   "[permute_rows] dst_row[7]=12 is outside [0, 8) (found on the device; reported at the next
//   synchronisation)"
// -- as CUDA reports a kernel's fault at the next synchronising call, but without spoiling the
// device's context: the error is a moecore::Error like the CPU's.
#pragma once

#include <cstdint>

namespace moecore::kernels::cuda {

// Queues the check of indices[0, count) (device memory) against [lowest, limit) on the backend's
// stream (lowest: 0, or -1 where -1 marks an empty slot). op and name must be string literals
// (their addresses travel through the device).
void check_indices_inside(const char* op, const char* name, const int32_t* indices, int64_t count,
                          int64_t limit, int32_t lowest = 0);

// Creates the record in mapped host memory (otherwise made by the first check or wait).
void prepare_index_checks();

// Throws the pending index error, if any, and clears it. Only after the stream has been waited
// for (synchronize() calls it); the record is complete then.
void throw_pending_index_error();

}  // namespace moecore::kernels::cuda
