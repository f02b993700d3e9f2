#include "cli/mx_commands.h"

#include <fmt/ranges.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cli/distinct_paths.h"
#include "core/check.h"
#include "core/mx_types.h"
#include "data/npy.h"

namespace moecore::cli {
namespace {

struct Array {
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  size_t numel = 0;
};

// The whole array, copied out of the mapping (which need not be aligned for floats).
Array read_array(const std::string& path, const std::string& descr, const char* option) {
  const data::NpyFile file = data::NpyFile::open(path);
  MOE_CHECK(file.dtype() == descr, "[mx] {} {}: dtype '{}' (expected '{}')", option, path,
            file.dtype(), descr);
  Array array{file.shape(), std::vector<uint8_t>(file.numel() * file.itemsize()), file.numel()};
  if (!array.bytes.empty()) std::memcpy(array.bytes.data(), file.data(), array.bytes.size());
  return array;
}

// [rows, K] of a 1-D or 2-D array whose last dimension is the contraction dimension.
void rows_and_k(const Array& array, const char* option, const std::string& path, int64_t& rows,
                int64_t& k) {
  MOE_CHECK(array.shape.size() == 1 || array.shape.size() == 2,
            "[mx] {} {}: expected a 1-D or 2-D array, got {} dimensions", option, path,
            array.shape.size());
  k = array.shape.back();
  rows = array.shape.size() == 2 ? array.shape[0] : 1;
}

}  // namespace

void run_mx_quantize(const MxArgs& args) {
  check_outputs_apart({{"--input", args.input}},
                      {{"--codes", args.codes}, {"--scales", args.scales}});
  const mx::ElemType elem = mx::parse_elem_type(args.elem, "--elem");
  const mx::ScaleMode mode = mx::parse_scale_mode(args.scale, "--scale");
  const Array x = read_array(args.input, "<f4", "--input");
  int64_t rows = 0, k = 0;
  rows_and_k(x, "--input", args.input, rows, k);
  mx::check_mx_contraction("mx quantize", k);
  std::vector<float> values(x.numel);
  std::memcpy(values.data(), x.bytes.data(), x.bytes.size());
  std::vector<uint8_t> codes(x.numel), scales(x.numel / mx::kMxBlock);
  mx::quantize(elem, mode, rows, k, values.data(), k, codes.data(), scales.data());
  std::vector<int64_t> scale_shape = x.shape;
  scale_shape.back() = k / mx::kMxBlock;
  data::write_npy(args.codes, "|u1", x.shape, codes.data());
  data::write_npy(args.scales, "|u1", scale_shape, scales.data());
}

void run_mx_dequantize(const MxArgs& args) {
  check_outputs_apart({{"--codes", args.codes}, {"--scales", args.scales}}, {{"--out", args.out}});
  const mx::ElemType elem = mx::parse_elem_type(args.elem, "--elem");
  const Array codes = read_array(args.codes, "|u1", "--codes");
  const Array scales = read_array(args.scales, "|u1", "--scales");
  int64_t rows = 0, k = 0;
  rows_and_k(codes, "--codes", args.codes, rows, k);
  mx::check_mx_contraction("mx dequantize", k);
  std::vector<int64_t> scale_shape = codes.shape;
  scale_shape.back() = k / mx::kMxBlock;
  MOE_CHECK(scales.shape == scale_shape,
            "[mx] --scales {}: shape {}, expected {} (one scale per {} codes of the codes' {})",
            args.scales, scales.shape, scale_shape, mx::kMxBlock, codes.shape);
  std::vector<float> x(codes.numel);
  mx::dequantize(elem, rows, k, codes.bytes.data(), scales.bytes.data(), x.data());
  data::write_npy(args.out, "<f4", codes.shape, x.data());
}

void run_mx_encode(const MxArgs& args) {
  check_outputs_apart({{"--input", args.input}}, {{"--out", args.out}});
  const mx::ElemType elem = mx::parse_elem_type(args.elem, "--elem");
  const Array x = read_array(args.input, "<f4", "--input");
  std::vector<uint8_t> codes(x.numel);
  for (size_t i = 0; i < x.numel; ++i) {
    float v = 0.0f;
    std::memcpy(&v, x.bytes.data() + i * sizeof(float), sizeof(float));
    codes[i] = mx::encode_elem(elem, v);
  }
  data::write_npy(args.out, "|u1", x.shape, codes.data());
}

void run_mx_decode(const MxArgs& args) {
  check_outputs_apart({{"--input", args.input}}, {{"--out", args.out}});
  const bool scale = args.elem == "e8m0";
  MOE_CHECK(scale || args.elem == "e4m3" || args.elem == "e5m2",
            "[mx] --elem: unknown type '{}' (expected e4m3, e5m2 or e8m0)", args.elem);
  const mx::ElemType elem = scale ? mx::ElemType::kE4M3 : mx::parse_elem_type(args.elem, "--elem");
  const Array codes = read_array(args.input, "|u1", "--input");
  std::vector<float> x(codes.numel);
  for (size_t i = 0; i < codes.numel; ++i) {
    x[i] = scale ? mx::decode_e8m0(codes.bytes[i]) : mx::decode_elem(elem, codes.bytes[i]);
  }
  data::write_npy(args.out, "<f4", codes.shape, x.data());
}

}  // namespace moecore::cli
