#include "io/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstddef>

namespace moecore::io {

void Crc32c::update(std::span<const std::byte> data) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t left = data.size();
  while (left > 0) {  // crc32_iscsi's length is an int
    const size_t chunk = std::min<size_t>(left, size_t{1} << 30);
    running_ = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(chunk), running_);
    p += chunk;
    left -= chunk;
  }
}

uint32_t crc32c(std::span<const std::byte> data) {
  Crc32c crc;
  crc.update(data);
  return crc.value();
}

}  // namespace moecore::io
