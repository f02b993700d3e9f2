// glibc malloc settings for a training process, applied once at start-up.
#pragma once

namespace moecore {

// Keeps the memory of freed step-sized buffers (activations, gradients, GEMM operands) in the
// process instead of returning it to the kernel: by default glibc serves blocks above its mmap
// threshold with fresh mmaps and trims the heap top after large frees, so every training step
// page-faults its whole working set back in and zero-fills it (measured: ~15% of a bench.toml
// step in the kernel's fault path). A no-op under the sanitizers, which bring their own allocator.
void tune_allocator_for_training();

}  // namespace moecore
