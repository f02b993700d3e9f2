// Scratch memory for the temporaries of a pass (a backward's input gradients, a forward's branch
// output), sized once per run. Buffers are taken in stack order inside a Workspace::Scope and go
// back when the scope ends, as locals would; the bytes come from blocks the workspace keeps, so a
// training step asks the heap for nothing once the first step has sized it (issue 14: no heap
// allocation above 64 KiB after the first step, counted by tests/alloc).
//
// Growth: a request that does not fit the current block opens another of its size (what was taken
// stays where it is; released blocks that are too small are freed first); when the outermost scope
// ends after such growth, the blocks are replaced by one block of the high-water mark, so the next
// pass with the same shapes runs from a single block. The memory held is about the peak of the
// locals it replaces: what a scope took is reused by the next scope. Host blocks are mapped
// pages (core/host_pages.h), so that replaced blocks go back to the system rather than stay in
// malloc's heap beside their replacement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "core/device_memory.h"
#include "core/host_pages.h"

namespace moecore {

class Workspace {
 public:
  // On the default device (core/device_memory.h) at construction: the passes' temporaries live
  // where their tensors do.
  Workspace() : device_(default_device()) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // What a scope takes is released when the scope ends; scopes nest (one per function that needs
  // temporaries) and end in reverse order of creation.
  class Scope {
   public:
    explicit Scope(Workspace& workspace);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

    // `count` elements, zero-filled, as a fresh std::vector<T>(count) would be.
    template <typename T>
    std::span<T> zeroed(int64_t count) {
      const std::span<T> buffer = uninitialized<T>(count);
      if (!buffer.empty()) zero_bytes(buffer.data(), buffer.size_bytes());
      return buffer;
    }
    // `count` elements for an output that is written in full before it is read.
    template <typename T>
    std::span<T> uninitialized(int64_t count) {
      static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= kAlignment);
      return {static_cast<T*>(workspace_.take(count, sizeof(T))), static_cast<size_t>(count)};
    }

   private:
    Workspace& workspace_;
    size_t block_;  // where the workspace stood when the scope began
    size_t used_;
    size_t live_;
  };

  Device device() const { return device_; }
  // Bytes held in blocks (for memory reports and tests).
  size_t capacity_bytes() const;
  // Blocks allocated since construction (a test shows it stops growing after the first pass).
  int64_t block_allocations() const { return block_allocations_; }
  // Whether host blocks are mapped pages (core/host_pages.h): all builds but AddressSanitizer's,
  // whose allocator's red zones report a buffer written past a block's end.
  static bool host_blocks_mapped();

 private:
  // Every buffer starts on a cache line (and so suits any SIMD load).
  static constexpr size_t kAlignment = 64;

  struct Block {
    DeviceArray<std::byte> bytes;  // on a device
    HostPages pages;               // on the host
    size_t size = 0;
    size_t used = 0;  // from the block's first aligned byte
    std::byte* begin() const;
  };

  void* take(int64_t count, size_t element_bytes);
  void release_to(size_t block, size_t used, size_t live);
  void add_block(size_t size);

  Device device_;
  std::vector<Block> blocks_;
  size_t current_ = 0;     // the block taking requests
  size_t live_ = 0;        // bytes taken and not yet released, across the blocks
  size_t high_water_ = 0;  // the most bytes live at once
  int depth_ = 0;          // open scopes
  int64_t block_allocations_ = 0;
};

}  // namespace moecore
