// Host memory mapped straight from the kernel (anonymous mmap), for long-lived scratch whose
// size settles after a first pass: freed, its pages go back to the system at once. Through
// malloc, blocks up to 32 MiB would stay in the heap after they are freed (core/
// allocator_tuning.h keeps the heap for the step's reuse) and add to the process's peak beside
// the block that replaces them.
#pragma once

#include <cstddef>

namespace moecore {

class HostPages {
 public:
  HostPages() = default;
  // `bytes` > 0, page-aligned, zero-filled (fresh pages); throws moecore::Error when the system
  // has no more.
  explicit HostPages(size_t bytes);
  ~HostPages();
  HostPages(HostPages&& other) noexcept;
  HostPages& operator=(HostPages&& other) noexcept;
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moecore
