// Counts the heap allocations above a size that a stretch of code makes, on every thread, and
// remembers where the first few came from. The executable that links heap_counter.cpp replaces
// the malloc family (malloc, calloc, realloc, reallocarray, posix_memalign, aligned_alloc,
// memalign, valloc, pvalloc, free) and every operator new / delete with versions that forward to
// glibc's own allocator (__libc_malloc, ...), so that oneDNN's and libgomp's mallocs are seen as
// well as the C++ code's news. Under the sanitizers (MOECORE_SANITIZE), which own malloc, nothing
// is replaced and counting is unavailable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moecore::test {

// False where the allocator cannot be replaced (the sanitizer builds).
bool heap_counting_available();

// Counts, from now on, every allocation request of more than `threshold_bytes` bytes. Requests
// made directly by code of the shared library that holds `apart_library_symbol` (nullptr: none)
// are counted apart: the caller decides what a third-party library's own allocations mean.
void start_counting_large_allocations(std::size_t threshold_bytes,
                                      const void* apart_library_symbol = nullptr);

struct LargeAllocations {
  int64_t count = 0;        // all but the library's own
  int64_t apart_count = 0;  // made by the library's code itself
  // One entry per counted allocation, for the first few of each kind: the function, the size and
  // the backtrace (demangled where the symbol is exported).
  std::string report;
  std::string apart_report;
};

// Stops counting; what was counted since the start.
LargeAllocations stop_counting_large_allocations();

}  // namespace moecore::test
