// src/model composes the kernels of kernels/ops.h and holds no compute kernel of its own. The test
// reads every unit of src/model and fails on the marks of a hand-written kernel:
//  - OpenMP (a pragma or <omp.h>) or SIMD-cloned loop bodies: threads and vector code belong to
//    kernels/cpu;
//  - a loop over a flattened element range, i.e. a `for` whose condition compares against a
//    product of extents without indexing (`e < n * d`, `j < rows * width`): the form of an
//    elementwise kernel (residual adds, scaling) written inline.
// Loops over layers, experts or tokens that call ops, check inputs or keep per-expert counts are
// composition and pass: their bounds are single extents (num_hidden_layers, e_count, n). What this
// rule cannot see, and review must: a nested element loop whose bounds are single extents.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moecore {
namespace {

std::string without_blanks(std::string line) {
  std::erase_if(line, [](char c) { return c == ' ' || c == '\t'; });
  return line;
}

// The condition of a `for (init; condition; step)` header on this line, or "" when there is none
// (range-for loops have no condition and iterate over containers, not element ranges).
std::string for_condition(const std::string& compact) {
  const size_t start = compact.find("for(");
  if (start == std::string::npos) return "";
  const size_t first = compact.find(';', start);
  if (first == std::string::npos) return "";
  const size_t second = compact.find(';', first + 1);
  if (second == std::string::npos) return "";
  return compact.substr(first + 1, second - first - 1);
}

// Why a line marks a kernel, or "" when it does not. (Plain string search: GCC 12's std::regex
// trips -Wmaybe-uninitialized under the ASan build, and the marks need no pattern.)
std::string kernel_mark(const std::string& line) {
  if (line.find("MOECORE_SIMD_CLONES") != std::string::npos) return "a SIMD-cloned body";
  const std::string compact = without_blanks(line);
  if (compact.starts_with("#pragmaomp") || compact.starts_with("#include<omp.h>")) return "OpenMP";
  const std::string condition = for_condition(compact);
  if (condition.find('<') != std::string::npos && condition.find('*') != std::string::npos &&
      condition.find('[') == std::string::npos)
    return "a loop over a flattened element range";
  return "";
}

TEST(ModelComposesOps, TheRuleSeesKernels) {
  EXPECT_NE(kernel_mark("#pragma omp parallel for"), "");
  EXPECT_NE(kernel_mark("  # pragma omp simd"), "");
  EXPECT_NE(kernel_mark("#include <omp.h>"), "");
  EXPECT_NE(kernel_mark("MOECORE_SIMD_CLONES void f(float* x);"), "");
  EXPECT_NE(kernel_mark("    for (int64_t e = 0; e < n * d; ++e)"), "");
  EXPECT_NE(kernel_mark("for (int64_t j = 0; j < rows * width; ++j) y[j] += x[j];"), "");
  // Composition: loops over layers, experts, tokens, containers.
  EXPECT_EQ(kernel_mark("  for (int64_t i = layers_begin_; i < layers_end_; ++i) {"), "");
  EXPECT_EQ(kernel_mark("  for (int64_t e = 0; e < e_count; ++e)"), "");
  EXPECT_EQ(kernel_mark("  for (auto& r : act.residual) r.resize(static_cast<size_t>(n * d));"),
            "");
  EXPECT_EQ(kernel_mark("for (int64_t i = 0; i < cache.recv_counts[at(src * local + le)]; ++i)"),
            "");
}

TEST(ModelComposesOps, NoComputeKernelsInSrcModel) {
  // MOECORE_FUZZ_DIR is <source>/tests/fuzz.
  const std::filesystem::path model_dir =
      std::filesystem::path(MOECORE_FUZZ_DIR).parent_path().parent_path() / "src" / "model";
  ASSERT_TRUE(std::filesystem::is_directory(model_dir)) << model_dir;
  int units = 0;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir)) {
    std::ifstream in(entry.path());
    ++units;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      const std::string mark = kernel_mark(line);
      EXPECT_EQ(mark, "") << "src/model/" << entry.path().filename().string() << ":" << number
                          << " holds " << mark << ": move it into src/kernels\n  " << line;
    }
  }
  EXPECT_GT(units, 10) << "src/model looks empty: " << model_dir;
}

}  // namespace
}  // namespace moecore
