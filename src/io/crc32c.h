// CRC-32C (Castagnoli, as in iSCSI / RFC 3720), through Intel ISA-L's crc32_iscsi (the CPU's CRC32
// instruction where it has one): TensorBoard's records and the checkpoints' checksums.
#pragma once

#include <cstdint>
#include <span>

namespace moecore::io {

// A CRC-32C over bytes given in pieces: the same value as crc32c() of their concatenation.
class Crc32c {
 public:
  void update(std::span<const std::byte> data);
  uint32_t value() const { return ~running_; }

 private:
  uint32_t running_ = 0xffffffffu;  // pre-inverted, as crc32_iscsi takes and returns it
};

// crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::span<const std::byte> data);

}  // namespace moecore::io
