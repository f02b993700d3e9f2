// libFuzzer target: moecore::fuzz::read_run_config (fuzz_readers.h) on the input as TOML text.
#include <string>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return moecore::fuzz::run_one([&] { moecore::fuzz::read_run_config(text); });
}
