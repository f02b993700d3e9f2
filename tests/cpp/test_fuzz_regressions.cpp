// The fuzz targets' inputs, run by `make test` in the normal build (tests/fuzz/README.md):
// - every kept finding, tests/fuzz/regressions/<reader>/*: the reader accepts it or rejects it
//   with an error message, never crashes, and an accepted input keeps the target's invariants;
//   the address space is capped meanwhile (outside ASan builds, whose shadow memory needs
//   terabytes of it), so a reader that believes a size field and asks for gigabytes fails the test
//   at once instead of swapping (libFuzzer's -malloc_limit_mb, the same rule);
// - every seed, tests/fuzz/corpus/<reader>/*: accepted, which shows that the target reaches the
//   reader's success path (a target that rejected everything would fuzz only the first check).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_readers.h"

namespace fs = std::filesystem;
using moecore::fuzz::Finding;

namespace {

const fs::path kFuzzDir = MOECORE_FUZZ_DIR;

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && entry.path().filename() != "README.md")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCapAddressSpace = false;
#else
constexpr bool kCapAddressSpace = true;
#endif

// RLIMIT_AS at the current size plus 2 GiB while alive: no input here is over a few KiB.
class AddressSpaceCap {
 public:
  AddressSpaceCap() {
    if (!kCapAddressSpace || getrlimit(RLIMIT_AS, &saved_) != 0) return;
    std::ifstream statm("/proc/self/statm");
    unsigned long long pages = 0;
    if (!(statm >> pages)) return;
    const rlim_t cap = pages * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{2} << 30);
    if (saved_.rlim_cur != RLIM_INFINITY && saved_.rlim_cur < cap) return;
    rlimit limited = saved_;
    limited.rlim_cur = cap;
    active_ = setrlimit(RLIMIT_AS, &limited) == 0;
  }
  ~AddressSpaceCap() {
    if (active_) setrlimit(RLIMIT_AS, &saved_);
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

 private:
  rlimit saved_{};
  bool active_ = false;
};

// Feeds one input the way the reader's fuzz target does.
void feed(const std::string& reader, const fs::path& path) {
  if (reader == "safetensors") return moecore::fuzz::read_safetensors(path.string());
  if (reader == "npy") return moecore::fuzz::read_npy(path.string());
  if (reader == "icl_task") return moecore::fuzz::read_icl_requests(path.string());
  const std::string text = slurp(path);
  if (reader == "tokenizer") return moecore::fuzz::read_tokenizer(text);
  if (reader == "run_config") return moecore::fuzz::read_run_config(text);
  if (reader == "trainer_state") return moecore::fuzz::read_trainer_state(text);
  if (reader == "hf_config") return moecore::fuzz::read_hf_config(text);
  FAIL() << "unknown reader " << reader;
}

class FuzzInputs : public testing::TestWithParam<std::string> {};

TEST_P(FuzzInputs, KeptFindingsAreRejectedCleanlyOrAccepted) {
  const std::vector<fs::path> cases = files_in(kFuzzDir / "regressions" / GetParam());
  // Every reader keeps at least its hand-made hostile cases: an empty or moved folder must not
  // pass by testing nothing.
  ASSERT_FALSE(cases.empty()) << (kFuzzDir / "regressions" / GetParam());
  for (const fs::path& path : cases) {
    SCOPED_TRACE(path.string());
    try {
      const AddressSpaceCap cap;
      feed(GetParam(), path);
    } catch (const Finding& finding) {
      ADD_FAILURE() << "invariant broken: " << finding.what;
    } catch (const std::bad_alloc&) {
      ADD_FAILURE() << "the reader asked for gigabytes on a tiny input";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()), "");  // an error the user can read
    }
  }
}

TEST_P(FuzzInputs, SeedsAreAccepted) {
  const std::vector<fs::path> seeds = files_in(kFuzzDir / "corpus" / GetParam());
  ASSERT_FALSE(seeds.empty()) << (kFuzzDir / "corpus" / GetParam());
  for (const fs::path& path : seeds) {
    SCOPED_TRACE(path.string());
    try {
      feed(GetParam(), path);
    } catch (const Finding& finding) {
      ADD_FAILURE() << "invariant broken: " << finding.what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed rejected: " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Readers, FuzzInputs,
                         testing::Values("safetensors", "npy", "tokenizer", "run_config",
                                         "trainer_state", "hf_config", "icl_task"),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
