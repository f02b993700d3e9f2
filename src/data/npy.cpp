#include "data/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <optional>
#include <span>
#include <string_view>

#include "core/check.h"

namespace moecore::data {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct DtypeSpec {
  const char* descr;
  size_t itemsize;
  bool is_integer;
  bool is_signed;
};

constexpr DtypeSpec kDtypes[] = {
    {"|u1", 1, true, false}, {"|b1", 1, true, false}, {"<u2", 2, true, false},
    {"<u4", 4, true, false}, {"<i4", 4, true, true},  {"<i8", 8, true, true},
    {"<f4", 4, false, true},
};

const DtypeSpec* find_dtype(std::string_view descr) {
  for (const DtypeSpec& spec : kDtypes) {
    if (descr == spec.descr) return &spec;
  }
  return nullptr;
}

// Parser for the header, a Python dict literal such as
// {'descr': '<u2', 'fortran_order': False, 'shape': (1024,), }
// Only the three keys NumPy writes are accepted; values are strings, booleans and int tuples.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        skip_space();
        // A list descr is a structured dtype, which moecore never uses.
        MOE_CHECK(peek() == '\'' || peek() == '"', "[npy] {}: unsupported structured dtype", path_);
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        shape = parse_shape();
        have_shape = true;
      } else {
        fail("[npy] {}: unexpected header key '{}'", path_, key);
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      MOE_CHECK(peek() == '}', "[npy] {}: malformed header at byte {}: expected ',' or '}}'", path_,
                pos_);
    }
    ++pos_;
    MOE_CHECK(have_descr && have_order && have_shape,
              "[npy] {}: header lacks one of 'descr', 'fortran_order', 'shape'", path_);
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n'))
      ++pos_;
  }

  void expect(char c) {
    skip_space();
    MOE_CHECK(peek() == c, "[npy] {}: malformed header at byte {}: expected '{}'", path_, pos_, c);
    ++pos_;
  }

  std::string parse_string() {
    skip_space();
    const char quote = peek();
    MOE_CHECK(quote == '\'' || quote == '"',
              "[npy] {}: malformed header at byte {}: expected a string", path_, pos_);
    const size_t close = text_.find(quote, pos_ + 1);
    MOE_CHECK(close != std::string_view::npos, "[npy] {}: malformed header: unterminated string",
              path_);
    std::string value(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
    return value;
  }

  bool parse_bool() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("[npy] {}: malformed header at byte {}: expected True or False", path_, pos_);
  }

  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      MOE_CHECK(peek() >= '0' && peek() <= '9',
                "[npy] {}: malformed header at byte {}: expected a non-negative dimension", path_,
                pos_);
      int64_t extent = 0;
      while (peek() >= '0' && peek() <= '9') {
        MOE_CHECK(!__builtin_mul_overflow(extent, 10, &extent) &&
                      !__builtin_add_overflow(extent, peek() - '0', &extent),
                  "[npy] {}: shape dimension overflows int64", path_);
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long suffix.
      shape.push_back(extent);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      MOE_CHECK(peek() == ')', "[npy] {}: malformed header at byte {}: expected ',' or ')'", path_,
                pos_);
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

template <typename T>
int64_t load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // The data need not be aligned to sizeof(T).
  return static_cast<int64_t>(value);
}

}  // namespace

NpyFile NpyFile::open(const std::string& path) {
  NpyFile npy;
  npy.path_ = path;
  npy.file_ = io::MappedFile::open(path, "[npy]");
  const std::byte* base = npy.file_.data();
  const size_t size = npy.file_.size();

  MOE_CHECK(size >= 10 && std::memcmp(base, kMagic, kMagicSize) == 0,
            "[npy] {}: not a .npy file (bad magic)", path);
  const auto major = static_cast<uint8_t>(base[6]);
  MOE_CHECK(major == 1 || major == 2, "[npy] {}: unsupported format version {}.{}", path, major,
            static_cast<uint8_t>(base[7]));
  size_t header_start = 0;
  size_t header_len = 0;
  if (major == 1) {
    uint16_t len16 = 0;
    std::memcpy(&len16, base + 8, 2);
    header_start = 10;
    header_len = len16;
  } else {
    MOE_CHECK(size >= 12, "[npy] {}: truncated header", path);
    uint32_t len32 = 0;
    std::memcpy(&len32, base + 8, 4);
    header_start = 12;
    header_len = len32;
  }
  MOE_CHECK(header_len <= size - header_start,
            "[npy] {}: header length {} exceeds the {} bytes that follow it", path, header_len,
            size - header_start);

  bool fortran_order = false;
  const std::string_view header(reinterpret_cast<const char*>(base + header_start), header_len);
  HeaderParser(header, path).parse(npy.descr_, fortran_order, npy.shape_);

  MOE_CHECK(npy.descr_.empty() || npy.descr_[0] != '>',
            "[npy] {}: big-endian dtype '{}' is not supported", path, npy.descr_);
  const DtypeSpec* spec = find_dtype(npy.descr_);
  MOE_CHECK(spec != nullptr, "[npy] {}: unsupported dtype '{}'", path, npy.descr_);
  MOE_CHECK(!fortran_order, "[npy] {}: fortran_order=True is not supported; save a C-order array",
            path);
  npy.itemsize_ = spec->itemsize;
  npy.is_integer_ = spec->is_integer;

  size_t numel = 1;
  for (const int64_t extent : npy.shape_) {
    MOE_CHECK(!__builtin_mul_overflow(numel, static_cast<size_t>(extent), &numel),
              "[npy] {}: shape {} overflows", path, npy.shape_);
  }
  npy.numel_ = numel;
  size_t expected_bytes = 0;
  MOE_CHECK(!__builtin_mul_overflow(numel, npy.itemsize_, &expected_bytes),
            "[npy] {}: shape {} overflows", path, npy.shape_);
  const size_t data_offset = header_start + header_len;
  const size_t found_bytes = size - data_offset;
  MOE_CHECK(found_bytes >= expected_bytes,
            "[npy] {}: truncated: expected {} bytes of data, found {}", path, expected_bytes,
            found_bytes);
  npy.data_ = base + data_offset;
  return npy;
}

int64_t NpyFile::int_at(size_t i) const {
  MOE_CHECK(is_integer_, "[npy] {}: int_at on non-integer dtype '{}'", path_, descr_);
  MOE_CHECK(i < numel_, "[npy] {}: index {} out of range for {} elements", path_, i, numel_);
  const std::byte* p = data_ + i * itemsize_;
  switch (itemsize_) {
    case 1:
      return load<uint8_t>(p);
    case 2:
      return load<uint16_t>(p);
    case 4:
      return descr_ == "<i4" ? load<int32_t>(p) : load<uint32_t>(p);
    default:
      return load<int64_t>(p);
  }
}

void NpyFile::read_ints(std::vector<int64_t>& out) const {
  MOE_CHECK(is_integer_, "[npy] {}: read_ints on non-integer dtype '{}'", path_, descr_);
  out.resize(numel_);
  for (size_t i = 0; i < numel_; ++i) out[i] = int_at(i);
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data) {
  const DtypeSpec* spec = find_dtype(descr);
  MOE_CHECK(spec != nullptr,
            "[npy] cannot write '{}': unsupported dtype '{}' (use |u1, <u2, <u4, <i4, <i8 or <f4)",
            path, descr);
  size_t numel = 1;
  for (const int64_t extent : shape) {
    MOE_CHECK(extent >= 0, "[npy] cannot write '{}': negative shape {}", path, shape);
    numel *= static_cast<size_t>(extent);
  }
  MOE_CHECK(data != nullptr || numel == 0, "[npy] cannot write '{}': null data", path);

  // Python tuple syntax: (), (n,), (a, b).
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_text += fmt::format("{}{}", i == 0 ? "" : ", ", shape[i]);
  }
  shape_text += shape.size() == 1 ? ",)" : ")";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape_text);

  // NumPy pads with spaces and a final newline so the data starts on a 64-byte boundary.
  const bool v2 = header.size() + 11 + 63 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');

  std::string preamble(kMagic, kMagicSize);
  preamble.push_back(v2 ? '\x02' : '\x01');
  preamble.push_back('\x00');
  const uint32_t len = static_cast<uint32_t>(header.size());
  preamble.append(reinterpret_cast<const char*>(&len), v2 ? 4 : 2);  // Little-endian host.
  preamble += header;

  const std::span<const std::byte> chunks[] = {
      std::as_bytes(std::span(preamble)),
      {static_cast<const std::byte*>(data), numel * spec->itemsize}};
  io::write_file_atomic(path, chunks, "[npy]");
}

}  // namespace moecore::data
