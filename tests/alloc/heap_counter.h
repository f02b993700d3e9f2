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

// Counts, from now on, every allocation request of more than `threshold_bytes` bytes, by whose
// code made it: the program's own (the executable, which holds moecore, and the C and C++ runtimes
// it calls) or a library's (oneDNN, libgomp, MPI: code the program does not control), per library.
void start_counting_large_allocations(std::size_t threshold_bytes);

struct LargeAllocations {
  int64_t count = 0;  // the program's own
  // One entry per allocation, for the first few: the function, the size and the backtrace
  // (demangled where the symbol is exported).
  std::string report;
  int64_t library_count = 0;  // made by libraries' own code
  std::string by_library;     // "libdnnl.so.2 9972, mca_coll_libnbc.so 6"
};

// Stops counting; what was counted since the start.
LargeAllocations stop_counting_large_allocations();

}  // namespace moecore::test
