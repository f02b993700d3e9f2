#include "core/host_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/check.h"

namespace moecore {

HostPages::HostPages(size_t bytes) : size_(bytes) {
  MOE_CHECK(bytes > 0, "[memory] a mapping of 0 bytes");
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  MOE_CHECK(mapped != MAP_FAILED, "[memory] cannot map {} bytes of host memory: {}", bytes,
            std::strerror(errno));
  data_ = static_cast<std::byte*>(mapped);
}

HostPages::~HostPages() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

HostPages::HostPages(HostPages&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HostPages& HostPages::operator=(HostPages&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace moecore
