// What the seven fuzz targets (fuzz_*.cpp) call in moecore, compiled in the normal build for the
// check FuzzReaders.SourcesLinkAlone (tests/fuzz/check_sources_link.sh): the fuzz preset links
// its targets against MOECORE_FUZZ_READER_SOURCES alone (CMakeLists.txt), and this object's
// undefined symbols are what the targets need from them. Never called.
#include <string>
#include <string_view>

#include "fuzz_common.h"

namespace moecore::fuzz {

void call_every_reader(const std::string& path, const std::string& text);

void call_every_reader(const std::string& path, const std::string& text) {
  run_one([&] { read_safetensors(path); });
  run_one([&] { read_npy(path); });
  run_one([&] { read_tokenizer(std::string_view(text)); });
  run_one([&] { read_run_config(text); });
  run_one([&] { read_trainer_state(std::string_view(text)); });
  run_one([&] { read_hf_config(std::string_view(text)); });
  run_one([&] { read_icl_requests(path); });
}

}  // namespace moecore::fuzz
