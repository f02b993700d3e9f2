// libFuzzer target: moecore::fuzz::read_hf_config (fuzz_readers.h) on the input as text.
#include <string_view>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  return moecore::fuzz::run_one([&] { moecore::fuzz::read_hf_config(text); });
}
