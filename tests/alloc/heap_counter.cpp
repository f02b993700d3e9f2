#include "heap_counter.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>

namespace moecore::test {

namespace {

// Enough offenders and frames to name each distinct source, not so many that a failure's message
// drowns in them.
constexpr int kKeptAllocations = 8;
constexpr int kFrames = 24;

struct Offender {
  const char* function = nullptr;
  std::size_t bytes = 0;
  int depth = 0;
  void* frames[kFrames] = {};
};

// "function(mangled+0x12) [0x...]" -> "function(demangled+0x12) [0x...]".
std::string demangle_frame(const char* symbol) {
  const std::string line = symbol;
  const size_t open = line.find('(');
  const size_t plus = line.find('+', open);
  if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return line;
  const std::string mangled = line.substr(open + 1, plus - open - 1);
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || !name) return line;
  return line.substr(0, open + 1) + name.get() + line.substr(plus);
}

std::atomic<bool> counting{false};
std::atomic<std::size_t> threshold{0};

// The allocations of one kind: how many, and the first few with their backtraces.
struct Tally {
  std::atomic<int64_t> count{0};
  Offender kept[kKeptAllocations];

  void add(const char* function, std::size_t bytes) {
    const int64_t index = count.fetch_add(1, std::memory_order_relaxed);
    if (index >= kKeptAllocations) return;
    Offender& offender = kept[index];
    offender.function = function;
    offender.bytes = bytes;
    offender.depth = backtrace(offender.frames, kFrames);
  }
  std::string report() const {
    std::string text;
    const int64_t total = count.load();
    for (int64_t i = 0; i < std::min<int64_t>(total, kKeptAllocations); ++i) {
      const Offender& offender = kept[i];
      text += fmt::format("allocation {} of {}: {}({} bytes)\n", i + 1, total, offender.function,
                          offender.bytes);
      char** symbols = backtrace_symbols(offender.frames, offender.depth);
      // Frame 0 is the hook itself.
      for (int f = 1; symbols != nullptr && f < offender.depth; ++f)
        text += "    " + demangle_frame(symbols[f]) + "\n";
      std::free(symbols);
    }
    return text;
  }
};

Tally own;

// The modules whose requests are the program's own: the executable (moecore is linked into it
// statically) and the C and C++ runtimes it calls (std::string, fopen). Code in no module also
// counts as the program's.
constexpr int kOwnModules = 3;
std::atomic<const void*> own_modules[kOwnModules];

// Every other module (oneDNN, libgomp, MPI and its components), counted by load address.
constexpr int kLibraries = 32;
struct LibraryCount {
  std::atomic<const void*> base{nullptr};
  const char* name = nullptr;  // dladdr's file name, valid while the module is loaded
  std::atomic<int64_t> count{0};
};
LibraryCount libraries[kLibraries];

void count_library(const void* base, const char* name) {
  for (LibraryCount& library : libraries) {
    const void* seen = nullptr;
    if (library.base.compare_exchange_strong(seen, base)) {
      library.name = name;
      seen = base;
    }
    if (seen == base) {
      library.count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

// backtrace() and dladdr() may allocate (the unwinder loads libgcc_s on its first call): not
// counted.
thread_local bool inside_hook = false;

const void* module_base(const void* address) {
  Dl_info info{};
  return address != nullptr && dladdr(address, &info) != 0 ? info.dli_fbase : nullptr;
}

// `caller`: the return address of the replaced function, i.e. the code that asked the heap.
// (Unused under the sanitizers, where nothing is replaced.)
[[maybe_unused]] void note_allocation(const char* function, std::size_t bytes, const void* caller) {
  if (!counting.load(std::memory_order_relaxed) ||
      bytes <= threshold.load(std::memory_order_relaxed) || inside_hook)
    return;
  inside_hook = true;
  Dl_info info{};
  const void* base = caller != nullptr && dladdr(caller, &info) != 0 ? info.dli_fbase : nullptr;
  bool program = base == nullptr;
  for (const auto& module : own_modules) program = program || module.load() == base;
  if (program) {
    own.add(function, bytes);
  } else {
    count_library(base, info.dli_fname);
  }
  inside_hook = false;
}

}  // namespace

#ifdef MOECORE_SANITIZE

bool heap_counting_available() {
  return false;
}

#else

bool heap_counting_available() {
  return true;
}

#endif

void start_counting_large_allocations(std::size_t threshold_bytes) {
  void* warm[1];
  (void)backtrace(warm, 1);  // loads the unwinder now, not inside the first counted allocation
  own_modules[0] = module_base(reinterpret_cast<const void*>(&note_allocation));
  own_modules[1] = module_base(reinterpret_cast<const void*>(&std::get_terminate));
  own_modules[2] = module_base(reinterpret_cast<const void*>(&fclose));
  own.count.store(0);
  for (LibraryCount& library : libraries) {
    library.base.store(nullptr);
    library.count.store(0);
  }
  threshold.store(threshold_bytes);
  counting.store(true);
}

LargeAllocations stop_counting_large_allocations() {
  counting.store(false);
  LargeAllocations result;
  result.count = own.count.load();
  result.report = own.report();
  for (const LibraryCount& library : libraries) {
    if (library.base.load() == nullptr) continue;
    result.library_count += library.count.load();
    result.by_library +=
        fmt::format("{}{} {}", result.by_library.empty() ? "" : ", ",
                    std::filesystem::path(library.name).filename().string(), library.count.load());
  }
  return result;
}

}  // namespace moecore::test

#ifndef MOECORE_SANITIZE

// glibc's allocator under its internal names (exported by glibc 2.36, Debian 12): the replacements
// below count, then forward here, so every block still comes from and returns to glibc malloc.
// (They are declared noexcept as glibc's headers declare the public names.)
extern "C" {
void* __libc_malloc(std::size_t bytes);
void* __libc_calloc(std::size_t count, std::size_t bytes);
void* __libc_realloc(void* block, std::size_t bytes);
void* __libc_memalign(std::size_t alignment, std::size_t bytes);
void* __libc_valloc(std::size_t bytes);
void* __libc_pvalloc(std::size_t bytes);
void __libc_free(void* block);
}

using moecore::test::note_allocation;

extern "C" {

void* malloc(std::size_t bytes) noexcept {
  note_allocation("malloc", bytes, __builtin_return_address(0));
  return __libc_malloc(bytes);
}

void* calloc(std::size_t count, std::size_t bytes) noexcept {
  std::size_t total = 0;
  note_allocation("calloc", __builtin_mul_overflow(count, bytes, &total) ? SIZE_MAX : total,
                  __builtin_return_address(0));
  return __libc_calloc(count, bytes);
}

void* realloc(void* block, std::size_t bytes) noexcept {
  note_allocation("realloc", bytes, __builtin_return_address(0));
  return __libc_realloc(block, bytes);
}

// glibc's reallocarray calls its realloc internally, past the replacement above.
void* reallocarray(void* block, std::size_t count, std::size_t bytes) noexcept {
  std::size_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  note_allocation("reallocarray", total, __builtin_return_address(0));
  return __libc_realloc(block, total);
}

void* memalign(std::size_t alignment, std::size_t bytes) noexcept {
  note_allocation("memalign", bytes, __builtin_return_address(0));
  return __libc_memalign(alignment, bytes);
}

void* aligned_alloc(std::size_t alignment, std::size_t bytes) noexcept {
  note_allocation("aligned_alloc", bytes, __builtin_return_address(0));
  return __libc_memalign(alignment, bytes);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t bytes) noexcept {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  note_allocation("posix_memalign", bytes, __builtin_return_address(0));
  void* block = __libc_memalign(alignment, bytes);
  if (block == nullptr && bytes != 0) return ENOMEM;
  *out = block;
  return 0;
}

void* valloc(std::size_t bytes) noexcept {
  note_allocation("valloc", bytes, __builtin_return_address(0));
  return __libc_valloc(bytes);
}

void* pvalloc(std::size_t bytes) noexcept {
  note_allocation("pvalloc", bytes, __builtin_return_address(0));
  return __libc_pvalloc(bytes);
}

void free(void* block) noexcept {
  __libc_free(block);
}

}  // extern "C"

// Every replaceable operator new: counted under its own name and its caller (libstdc++'s would
// reach the replaced malloc too, but as "malloc" called from libstdc++).
namespace {

void* counted_new(const void* caller, const char* function, std::size_t bytes,
                  std::size_t alignment, bool nothrow) {
  note_allocation(function, bytes, caller);
  const std::size_t size = bytes == 0 ? 1 : bytes;
  void* block = alignment <= alignof(std::max_align_t) ? __libc_malloc(size)
                                                       : __libc_memalign(alignment, size);
  if (block == nullptr && !nothrow) throw std::bad_alloc();
  return block;
}

}  // namespace

void* operator new(std::size_t bytes) {
  return counted_new(__builtin_return_address(0), "operator new", bytes, 0, false);
}
void* operator new[](std::size_t bytes) {
  return counted_new(__builtin_return_address(0), "operator new[]", bytes, 0, false);
}
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  return counted_new(__builtin_return_address(0), "operator new", bytes, 0, true);
}
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  return counted_new(__builtin_return_address(0), "operator new[]", bytes, 0, true);
}
void* operator new(std::size_t bytes, std::align_val_t alignment) {
  return counted_new(__builtin_return_address(0), "operator new", bytes,
                     static_cast<std::size_t>(alignment), false);
}
void* operator new[](std::size_t bytes, std::align_val_t alignment) {
  return counted_new(__builtin_return_address(0), "operator new[]", bytes,
                     static_cast<std::size_t>(alignment), false);
}
void* operator new(std::size_t bytes, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_new(__builtin_return_address(0), "operator new", bytes,
                     static_cast<std::size_t>(alignment), true);
}
void* operator new[](std::size_t bytes, std::align_val_t alignment,
                     const std::nothrow_t&) noexcept {
  return counted_new(__builtin_return_address(0), "operator new[]", bytes,
                     static_cast<std::size_t>(alignment), true);
}

void operator delete(void* block) noexcept {
  __libc_free(block);
}
void operator delete[](void* block) noexcept {
  __libc_free(block);
}
void operator delete(void* block, std::size_t) noexcept {
  __libc_free(block);
}
void operator delete[](void* block, std::size_t) noexcept {
  __libc_free(block);
}
void operator delete(void* block, const std::nothrow_t&) noexcept {
  __libc_free(block);
}
void operator delete[](void* block, const std::nothrow_t&) noexcept {
  __libc_free(block);
}
void operator delete(void* block, std::align_val_t) noexcept {
  __libc_free(block);
}
void operator delete[](void* block, std::align_val_t) noexcept {
  __libc_free(block);
}
void operator delete(void* block, std::size_t, std::align_val_t) noexcept {
  __libc_free(block);
}
void operator delete[](void* block, std::size_t, std::align_val_t) noexcept {
  __libc_free(block);
}
void operator delete(void* block, std::align_val_t, const std::nothrow_t&) noexcept {
  __libc_free(block);
}
void operator delete[](void* block, std::align_val_t, const std::nothrow_t&) noexcept {
  __libc_free(block);
}

#endif  // MOECORE_SANITIZE
