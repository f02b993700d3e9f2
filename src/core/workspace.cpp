#include "core/workspace.h"

#include <algorithm>

#include "core/check.h"

namespace moecore {

namespace {

size_t round_up(size_t bytes, size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Workspace::host_blocks_mapped().
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapHostBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMapHostBlocks = false;
#else
constexpr bool kMapHostBlocks = true;
#endif
#else
constexpr bool kMapHostBlocks = true;
#endif

}  // namespace

std::byte* Workspace::Block::begin() const {
  if (pages.data() != nullptr) return pages.data();        // page-aligned
  std::byte* data = const_cast<std::byte*>(bytes.data());  // the workspace hands out its blocks
  const auto address = reinterpret_cast<uintptr_t>(data);
  return data + (round_up(address, kAlignment) - address);
}

Workspace::Scope::Scope(Workspace& workspace)
    : workspace_(workspace),
      block_(workspace.current_),
      used_(workspace.blocks_.empty() ? 0 : workspace.blocks_[workspace.current_].used),
      live_(workspace.live_) {
  ++workspace_.depth_;
}

Workspace::Scope::~Scope() {
  workspace_.release_to(block_, used_, live_);
}

bool Workspace::host_blocks_mapped() {
  return kMapHostBlocks;
}

size_t Workspace::capacity_bytes() const {
  size_t total = 0;
  for (const Block& block : blocks_) total += block.size;
  return total;
}

void* Workspace::take(int64_t count, size_t element_bytes) {
  MOE_CHECK(depth_ > 0, "[workspace] a buffer taken outside a Workspace::Scope");
  MOE_CHECK(count >= 0, "[workspace] negative element count {}", count);
  const size_t bytes = round_up(static_cast<size_t>(count) * element_bytes, kAlignment);
  if (bytes == 0) return nullptr;  // as an empty std::vector's data()
  if (blocks_.empty() || blocks_[current_].used + bytes > blocks_[current_].size) {
    // The blocks after the current one are empty (released): the next one if it fits, else they
    // go (as freed locals would) and a block of this request's size takes their place.
    const size_t next = blocks_.empty() ? 0 : current_ + 1;
    if (next == blocks_.size() || blocks_[next].size < bytes) {
      blocks_.resize(next);
      add_block(bytes);
    }
    current_ = next;
  }
  Block& block = blocks_[current_];
  std::byte* buffer = block.begin() + block.used;
  block.used += bytes;
  live_ += bytes;
  high_water_ = std::max(high_water_, live_);
  return buffer;
}

void Workspace::release_to(size_t block, size_t used, size_t live) {
  for (size_t b = block + 1; b < blocks_.size(); ++b) blocks_[b].used = 0;
  if (!blocks_.empty()) blocks_[block].used = used;
  current_ = block;
  live_ = live;
  if (--depth_ > 0 || blocks_.size() <= 1) return;
  // The outermost scope ended after growth: one block of the high-water mark from now on.
  blocks_.clear();
  current_ = 0;
  add_block(high_water_);
}

void Workspace::add_block(size_t size) {
  Block block;
  if (device_ == Device::kCpu && kMapHostBlocks) {
    // Straight from the system: the growth blocks of a first pass go back when the block of the
    // high-water mark replaces them, instead of staying in malloc's heap beside it (a pipeline's
    // first stage measured 13.6 % above its plan so, tests/train/test_plan_pipeline_peak.py).
    if (size > 0) block.pages = HostPages(size);
  } else {
    block.bytes = DeviceArray<std::byte>(device_);
    block.bytes.resize_for_overwrite(size + kAlignment);  // handed out uninitialised or zeroed()
  }
  block.size = size;
  blocks_.push_back(std::move(block));
  ++block_allocations_;
}

}  // namespace moecore
