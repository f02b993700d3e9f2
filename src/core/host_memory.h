// The host memory this process may use: a size beyond it is refused with one line before it is
// allocated, instead of the kernel's OOM killer ending the process without a message.
#pragma once

namespace moecore {

// The machine's physical memory; 0 when unknown.
double host_physical_memory_bytes();

// The machine's physical memory, or its cgroup's limit where that is lower (a container, a batch
// job's allocation); 0 when neither is known.
double host_memory_limit_bytes();

}  // namespace moecore
