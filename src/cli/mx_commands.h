// `moecore mx ...`: MX (microscaling) conversions of .npy files with moecore's own codecs
// (core/mx_types.h), the entry point of the conformance tests against ml_dtypes and torchao
// (tests/reference/test_mx_conformance.py) and a way to inspect what a tensor quantises to.
#pragma once

#include <string>

namespace moecore::cli {

struct MxArgs {
  std::string elem = "e4m3";    // e4m3 | e5m2 (decode also e8m0)
  std::string scale = "rceil";  // rceil | floor
  std::string input, codes, scales, out;
};

// input: float32 [rows, K] (or [K]) -> codes uint8 [rows, K], scales uint8 [rows, K / 32].
void run_mx_quantize(const MxArgs& args);
// codes + scales -> out: float32 [rows, K].
void run_mx_dequantize(const MxArgs& args);
// Element by element, any shape: float32 input -> uint8 out (RNE, saturating).
void run_mx_encode(const MxArgs& args);
// Element by element, any shape: uint8 input -> float32 out (elem e4m3, e5m2 or e8m0).
void run_mx_decode(const MxArgs& args);

}  // namespace moecore::cli
