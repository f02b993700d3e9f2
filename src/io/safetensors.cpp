#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/finite.h"
#include "io/json_excerpt.h"

namespace moecore::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors and npy data are little-endian and read in place");

namespace {

using nlohmann::json;

// Element size of every dtype the format defines; 0 means unknown.
size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},     {"I32", 4},
      {"F32", 4},  {"U64", 8}, {"I64", 8}, {"F64", 8}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace

// The reference reader (the `safetensors` package, 0.6.2) refuses headers over 100 MB.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

SafetensorsReader SafetensorsReader::open(const std::string& path, const char* tag) {
  SafetensorsReader reader;
  reader.path_ = path;
  reader.tag_ = tag;
  reader.file_ = MappedFile::open(path, tag);
  reader.parse(reader.file_.data(), reader.file_.size());
  return reader;
}

SafetensorsReader SafetensorsReader::from_bytes(std::vector<std::byte> bytes,
                                                const std::string& origin) {
  SafetensorsReader reader;
  reader.path_ = origin;
  reader.owned_ = std::move(bytes);
  reader.parse(reader.owned_.data(), reader.owned_.size());
  return reader;
}

// As strict as the reference reader (checked case by case in tests/cli/test_safetensors_strict.py
// against the `safetensors` package): the header is UTF-8 JSON (surrounding JSON whitespace is
// allowed, NUL padding and other trailing bytes are not), every tensor entry has a known dtype, a
// shape of non-negative integers and integer data_offsets, and the tensors' byte ranges, sorted by
// start, tile the data buffer exactly: no gap, no overlap, no trailing bytes. Stricter than the
// reference on one point: a key that appears twice (the reference keeps the last one silently).
void SafetensorsReader::parse(const std::byte* base, size_t file_size) {
  const std::string& path = path_;
  MOE_CHECK(file_size >= 8, "{} {}: file is {} bytes, shorter than the 8-byte header", tag_, path,
            file_size);
  uint64_t header_size = 0;
  std::memcpy(&header_size, base, 8);
  MOE_CHECK(header_size <= kMaxHeaderSize,
            "{} {}: header length {} exceeds the format's limit of {} bytes", tag_, path,
            header_size, kMaxHeaderSize);
  MOE_CHECK(header_size <= file_size - 8,
            "{} {}: header length {} exceeds the {} bytes that follow it", tag_, path, header_size,
            file_size - 8);

  const char* text = reinterpret_cast<const char*>(base + 8);
  // A raw NUL is not JSON anywhere (inside a string it must be written \u0000); the JSON library
  // would stop at it, so NUL padding after the object would pass unnoticed.
  const void* nul = std::memchr(text, '\0', header_size);
  MOE_CHECK(nul == nullptr,
            "{} {}: header holds a NUL byte at offset {} (NUL padding is not allowed; "
            "pad with spaces)",
            tag_, path, nul == nullptr ? 0 : static_cast<const char*>(nul) - text);
  json header;
  try {
    // Duplicate keys: the parser keeps the last one; each object's keys are tracked to refuse them.
    std::vector<std::unordered_set<std::string>> keys_per_object;
    header = json::parse(text, text + header_size,
                         [&](int /*depth*/, json::parse_event_t event, json& parsed) {
                           if (event == json::parse_event_t::object_start) {
                             keys_per_object.emplace_back();
                           } else if (event == json::parse_event_t::object_end) {
                             keys_per_object.pop_back();
                           } else if (event == json::parse_event_t::key) {
                             const std::string& key = parsed.get_ref<const std::string&>();
                             MOE_CHECK(keys_per_object.back().insert(key).second,
                                       "{} {}: header has key '{}' twice", tag_, path, key);
                           }
                           return true;
                         });
  } catch (const json::exception& e) {
    fail("{} {}: malformed JSON header: {}", tag_, path, e.what());
  }
  MOE_CHECK(header.is_object(), "{} {}: header is a JSON {}, expected an object", tag_, path,
            header.type_name());

  buffer_ = base + 8 + header_size;
  const size_t buffer_size = file_size - 8 - header_size;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;  // the reference accepts "__metadata__": null
      MOE_CHECK(entry.is_object(), "{} {}: __metadata__ is a JSON {}, expected an object", tag_,
                path, entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        MOE_CHECK(value.is_string(), "{} {}: __metadata__ value for '{}' is not a string", tag_,
                  path, key);
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    MOE_CHECK(entry.is_object(), "{} {}: entry for tensor '{}' is not an object", tag_, path, name);
    MOE_CHECK(entry.contains("dtype") && entry["dtype"].is_string(),
              "{} {}: tensor '{}' has no string 'dtype'", tag_, path, name);
    MOE_CHECK(entry.contains("shape") && entry["shape"].is_array(),
              "{} {}: tensor '{}' has no 'shape' array", tag_, path, name);
    MOE_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                  entry["data_offsets"].size() == 2 &&
                  entry["data_offsets"][0].is_number_unsigned() &&
                  entry["data_offsets"][1].is_number_unsigned(),
              "{} {}: tensor '{}' needs 'data_offsets' [begin, end] of non-negative "
              "integers",
              tag_, path, name);

    TensorInfo info;
    info.dtype = entry["dtype"].get<std::string>();
    const size_t item_size = dtype_size(info.dtype);
    MOE_CHECK(item_size != 0, "{} {}: tensor '{}' has unknown dtype '{}'", tag_, path, name,
              info.dtype);

    uint64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      MOE_CHECK(dim.is_number_unsigned(),
                "{} {}: tensor '{}' has shape entry {}, expected a non-negative integer", tag_,
                path, name, json_excerpt(dim));
      const uint64_t extent = dim.get<uint64_t>();
      MOE_CHECK(extent <= static_cast<uint64_t>(INT64_MAX) &&
                    !__builtin_mul_overflow(numel, extent, &numel),
                "{} {}: tensor '{}' has an overflowing shape {}", tag_, path, name,
                json_excerpt(entry["shape"]));
      info.shape.push_back(static_cast<int64_t>(extent));
    }
    uint64_t nbytes = 0;
    MOE_CHECK(!__builtin_mul_overflow(numel, item_size, &nbytes),
              "{} {}: tensor '{}' has an overflowing shape {}", tag_, path, name,
              json_excerpt(entry["shape"]));

    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t end = entry["data_offsets"][1].get<uint64_t>();
    MOE_CHECK(begin <= end && end <= buffer_size,
              "{} {}: tensor '{}' has data_offsets [{}, {}] outside the {}-byte data "
              "buffer",
              tag_, path, name, begin, end, buffer_size);
    MOE_CHECK(end - begin == nbytes,
              "{} {}: tensor '{}' has data_offsets [{}, {}] ({} bytes), but {} x {} "
              "needs {} bytes",
              tag_, path, name, begin, end, end - begin, info.dtype, info.shape, nbytes);
    info.begin = static_cast<size_t>(begin);
    info.end = static_cast<size_t>(end);
    tensors_.emplace(name, std::move(info));
  }

  // The byte ranges, sorted by start, must tile [0, buffer size): each starts where the previous
  // one ended (empty tensors included), and the last ends at the end of the file.
  std::vector<std::tuple<size_t, size_t, const std::string*>> ranges;
  for (const auto& [name, info] : tensors_) ranges.emplace_back(info.begin, info.end, &name);
  std::sort(ranges.begin(), ranges.end());
  size_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, end, name] : ranges) {
    MOE_CHECK(begin == covered,
              "{} {}: tensor '{}' starts at byte {} of the data buffer, but {} ends at "
              "{} ({})",
              tag_, path, *name, begin, previous != nullptr ? "'" + *previous + "'" : "the start",
              covered, begin < covered ? "overlapping tensors" : "a gap between tensors");
    covered = end;
    previous = name;
  }
  MOE_CHECK(covered == buffer_size,
            "{} {}: {} trailing bytes after the last tensor (the tensors cover {} of the "
            "{}-byte data buffer)",
            tag_, path, buffer_size - covered, covered, buffer_size);
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) result.push_back(name);
  return result;  // std::map iterates in sorted order.
}

bool SafetensorsReader::has(const std::string& name) const {
  return tensors_.contains(name);
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  MOE_CHECK(it != tensors_.end(), "{} {}: missing tensor '{}'", tag_, path_, name);
  return it->second;
}

void SafetensorsReader::read_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape, float* dst) const {
  const TensorInfo& t = info(name);
  MOE_CHECK(t.shape == expected_shape, "{} {}: tensor '{}' has shape {}, expected {}", tag_, path_,
            name, t.shape, expected_shape);
  read_f32_elements(name, 0, (t.end - t.begin) / dtype_size(t.dtype), dst);
}

void SafetensorsReader::read_f32_elements(const std::string& name, size_t first, size_t count,
                                          float* dst) const {
  const TensorInfo& t = info(name);
  const bool is_f32 = t.dtype == "F32", is_bf16 = t.dtype == "BF16";
  MOE_CHECK(is_f32 || is_bf16 || t.dtype == "F16",
            "{} {}: tensor '{}' has dtype {}, expected F32, BF16 or F16", tag_, path_, name,
            t.dtype);
  const size_t width = is_f32 ? 4 : 2, numel = (t.end - t.begin) / width;
  MOE_CHECK(first <= numel && count <= numel - first,
            "{} {}: elements [{}, {}) are outside tensor '{}' of {} elements", tag_, path_, first,
            first + count, name, numel);
  // Only these bytes of the mapping are touched, so only their pages become resident.
  const std::byte* src = buffer_ + t.begin + first * width;
  if (is_f32) {
    copy_bytes(dst, src, count * width);
    return;
  }
  // Widened on the host, in place or (dst on a device) in a copy that then goes there.
  std::vector<float> widened;
  float* out = dst;
  if (device_of(dst) != Device::kCpu) {
    widened.resize(count);
    out = widened.data();
  }
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, src + 2 * i, 2);  // The buffer need not be 2-byte aligned.
    out[i] = is_bf16 ? bf16_to_float(bits) : f16_to_float(bits);
  }
  if (out != dst) copy_bytes(dst, out, count * sizeof(float));
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<float> values((t.end - t.begin) / dtype_size(t.dtype));
  read_f32(name, t.shape, values.data());
  return values;
}

// ---- Writer
// --------------------------------------------------------------------------------------

size_t SafetensorsWriter::checked_numel(const std::string& name,
                                        const std::vector<int64_t>& shape) const {
  MOE_CHECK(!name.empty() && name != "__metadata__", "[safetensors] invalid tensor name '{}'",
            name);
  MOE_CHECK(!tensors_.contains(name), "[safetensors] duplicate tensor name '{}'", name);
  size_t numel = 1;
  for (const int64_t extent : shape) {
    MOE_CHECK(extent >= 0, "[safetensors] tensor '{}' has negative shape {}", name, shape);
    numel *= static_cast<size_t>(extent);
  }
  return numel;
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                const float* data) {
  const size_t numel = checked_numel(name, shape);
  MOE_CHECK(data != nullptr || numel == 0, "[safetensors] tensor '{}' has null data", name);
  tensors_.emplace(name, Entry{std::move(shape), numel, data, {}});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                std::vector<float> values) {
  const size_t numel = checked_numel(name, shape);
  MOE_CHECK(values.size() == numel, "[safetensors] tensor '{}' has {} values for {} elements", name,
            values.size(), numel);
  tensors_.emplace(name, Entry{std::move(shape), numel, nullptr, std::move(values)});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  // nlohmann::json objects are std::maps, so dump() emits keys in sorted order; the data buffer
  // follows the same order.
  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const auto& [name, entry] : tensors_) {
    const size_t nbytes = entry.numel * sizeof(float);
    header[name] = {
        {"dtype", "F32"}, {"shape", entry.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // Invalid UTF-8 in a name or metadata value.
    fail("[safetensors] cannot write '{}': cannot encode header: {}", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  const uint64_t header_size = text.size();
  std::vector<const std::pair<const std::string, Entry>*> entries;  // in the header's order
  for (const auto& named : tensors_) entries.push_back(&named);
  std::vector<float> staging;  // a device tensor's values, one tensor at a time
  write_file_atomic(
      path, 2 + entries.size(),
      [&](size_t i) -> std::span<const std::byte> {
        if (i == 0) return std::as_bytes(std::span(&header_size, 1));
        if (i == 1) return std::as_bytes(std::span(text));
        const auto& [name, entry] = *entries[i - 2];
        const float* values = entry.values();
        if (entry.numel > 0 && device_of(values) != Device::kCpu) {
          staging.resize(entry.numel);
          copy_bytes(staging.data(), values, entry.numel * sizeof(float));
          values = staging.data();
        }
        if (require_finite_) {
          const float* bad = first_non_finite(values, values + entry.numel);
          MOE_CHECK(
              bad == values + entry.numel,
              "[safetensors] refusing to write '{}': tensor '{}' holds {} at element {} (only "
              "finite values are written here)",
              path, name, *bad, bad - values);
        }
        return std::as_bytes(std::span(values, entry.numel));
      },
      "[safetensors]");
}

}  // namespace moecore::io
