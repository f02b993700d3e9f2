#include "core/allocator_tuning.h"

#include <malloc.h>

namespace moecore {

void tune_allocator_for_training() {
  // The largest mmap threshold glibc accepts (half its 64 MiB heap size on 64-bit): blocks up to
  // it come from the heap and are reused; only larger ones (the LM head's logits at big batches)
  // still get their own mapping.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // Never trim: a process that trained one step will need the same memory for the next one.
  mallopt(M_TRIM_THRESHOLD, -1);
}

}  // namespace moecore
