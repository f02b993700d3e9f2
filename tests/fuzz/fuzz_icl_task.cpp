// libFuzzer target: moecore::fuzz::read_icl_requests (fuzz_readers.h) on a file holding the input.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return moecore::fuzz::run_one([&] {
    moecore::fuzz::read_icl_requests(moecore::fuzz::write_scratch(data, size, ".requests"));
  });
}
