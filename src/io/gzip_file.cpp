#include "io/gzip_file.h"

#include <isa-l/igzip_lib.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "core/check.h"
#include "io/file_util.h"

namespace moecore::io {

namespace {

const char* inflate_error_text(int code) {
  switch (code) {
    case ISAL_INVALID_BLOCK:
      return "an invalid deflate block";
    case ISAL_INVALID_SYMBOL:
      return "an invalid deflate symbol";
    case ISAL_INVALID_LOOKBACK:
      return "an invalid back-reference";
    case ISAL_INVALID_WRAPPER:
      return "an invalid gzip header";
    case ISAL_UNSUPPORTED_METHOD:
      return "a compression method other than deflate";
    case ISAL_INCORRECT_CHECKSUM:
      return "a wrong CRC-32 or length in a member's trailer";
    default:
      return "an inflate error";
  }
}

std::string inflate_gzip(const std::byte* data, size_t size, const std::string& path,
                         const char* tag) {
  MOE_CHECK(size <= std::numeric_limits<uint32_t>::max(),
            "{} {}: a gzip file over 4 GiB is not supported", tag, path);
  // inflate_state holds its Huffman tables (~20 KiB): on the heap, not the stack.
  auto state = std::make_unique<inflate_state>();
  std::string out;
  size_t offset = 0;
  while (offset < size) {  // one gzip member per pass
    isal_inflate_init(state.get());
    state->crc_flag = ISAL_GZIP;
    state->next_in = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(data + offset));
    state->avail_in = static_cast<uint32_t>(size - offset);
    for (;;) {
      if (out.size() == out.capacity() || out.capacity() - out.size() < 4096)
        out.reserve(std::max<size_t>(out.capacity() * 2, size * 4 + 65536));
      const size_t used = out.size();
      const size_t room = std::min<size_t>(out.capacity() - used, UINT32_MAX);
      out.resize(used + room);
      state->next_out = reinterpret_cast<uint8_t*>(out.data() + used);
      state->avail_out = static_cast<uint32_t>(room);
      const int rc = isal_inflate(state.get());
      out.resize(used + (room - state->avail_out));
      MOE_CHECK(rc == ISAL_DECOMP_OK || rc == ISAL_OUT_OVERFLOW || rc == ISAL_END_INPUT,
                "{} {}: not a valid gzip file ({} at compressed byte {})", tag, path,
                inflate_error_text(rc), size - state->avail_in);
      if (state->block_state == ISAL_BLOCK_FINISH) break;
      // Input used up before the member's end (a cut file), while the output still had room.
      MOE_CHECK(state->avail_in > 0 || state->avail_out == 0,
                "{} {}: the gzip stream ends early (truncated file?)", tag, path);
    }
    offset = size - state->avail_in;
    // What follows a member is another member or, as gzip(1) allows, zero padding.
    bool padding = true;
    for (size_t i = offset; i < size && padding; ++i) padding = data[i] == std::byte{0};
    if (padding) break;
  }
  return out;
}

}  // namespace

std::string read_maybe_gzip_file(const std::string& path, const char* tag) {
  const MappedFile file = MappedFile::open(path, tag);
  const std::byte* data = file.data();
  const size_t size = file.size();
  if (size >= 2 && data[0] == std::byte{0x1f} && data[1] == std::byte{0x8b})
    return inflate_gzip(data, size, path, tag);
  return size == 0 ? std::string() : std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace moecore::io
