// core/workspace.h: buffers in stack order inside scopes, zero-filled on request, aligned, and one
// block of the high-water mark after the first pass, so that the same pass again allocates nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "core/allocator_tuning.h"
#include "core/workspace.h"

namespace moecore {
namespace {

// A pass shaped like a backward: an outer scope with two buffers, an inner one with a larger
// buffer, then another inner one.
void run_pass(Workspace& workspace, int64_t scale) {
  Workspace::Scope outer(workspace);
  const std::span<float> dx = outer.zeroed<float>(1000 * scale);
  const std::span<double> stats = outer.zeroed<double>(3);
  dx[0] = 1.0f;
  stats[2] = 2.0;
  {
    Workspace::Scope inner(workspace);
    const std::span<float> scratch = inner.uninitialized<float>(5000 * scale);
    scratch[scratch.size() - 1] = 3.0f;
    EXPECT_NE(scratch.data(), dx.data());
  }
  Workspace::Scope again(workspace);
  const std::span<int32_t> index = again.zeroed<int32_t>(17 * scale);
  for (const int32_t i : index) EXPECT_EQ(i, 0);  // zero-filled over what the last scope wrote
  EXPECT_EQ(dx[0], 1.0f);  // earlier buffers of an outer scope keep their contents
  EXPECT_EQ(stats[2], 2.0);
}

TEST(Workspace, ZeroedBuffersAreZeroAndAligned) {
  Workspace workspace;
  Workspace::Scope scope(workspace);
  const std::span<float> a = scope.zeroed<float>(3);
  const std::span<float> b = scope.zeroed<float>(100);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(b.size(), 100u);
  for (const float v : b) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  // Disjoint: b starts after a ends or ends before a starts (a new block may lie anywhere).
  EXPECT_TRUE(b.data() >= a.data() + a.size() || b.data() + b.size() <= a.data());
  EXPECT_TRUE(scope.zeroed<float>(0).empty());
}

TEST(Workspace, SizedByTheFirstPassThenAllocatesNothing) {
  Workspace workspace;
  run_pass(workspace, 1);
  const int64_t after_first = workspace.block_allocations();
  EXPECT_GE(after_first, 1);
  // One block of the high-water mark: 1000 floats, 3 doubles and 5000 floats, each rounded up to
  // whole cache lines (4032 + 64 + 20032 bytes).
  EXPECT_EQ(workspace.capacity_bytes(), 24128u);
  for (int pass = 0; pass < 3; ++pass) run_pass(workspace, 1);
  EXPECT_EQ(workspace.block_allocations(), after_first);
  // Larger shapes grow it once more, then it is stable again.
  run_pass(workspace, 4);
  const int64_t after_growth = workspace.block_allocations();
  EXPECT_GT(after_growth, after_first);
  run_pass(workspace, 4);
  run_pass(workspace, 1);
  EXPECT_EQ(workspace.block_allocations(), after_growth);
}

int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// The blocks a first pass grows are replaced by one block of the high-water mark; they go back to
// the system then. Through malloc under the trainer's settings (core/allocator_tuning.h: blocks
// up to 32 MiB stay in the heap), three touched 24 MiB blocks stayed resident beside their
// untouched replacement: +72 MiB.
TEST(Workspace, ReplacedHostBlocksGoBackToTheSystem) {
  if (!Workspace::host_blocks_mapped())
    GTEST_SKIP() << "under AddressSanitizer host blocks come from its allocator (red zones)";
  tune_allocator_for_training();
  constexpr int64_t kBlock = int64_t{24} << 20;
  Workspace workspace;
  const int64_t before = resident_kib();
  ASSERT_GT(before, 0);
  {
    Workspace::Scope outer(workspace);
    outer.zeroed<std::byte>(kBlock)[0] = std::byte{1};
    Workspace::Scope middle(workspace);
    middle.zeroed<std::byte>(kBlock)[0] = std::byte{1};
    Workspace::Scope inner(workspace);
    inner.zeroed<std::byte>(kBlock)[0] = std::byte{1};
    EXPECT_GE(resident_kib() - before, 3 * kBlock / 1024 * 9 / 10);  // touched, resident
  }
  EXPECT_EQ(workspace.capacity_bytes(), static_cast<size_t>(3 * kBlock));
  EXPECT_LT(resident_kib() - before, kBlock / 1024);
}

}  // namespace
}  // namespace moecore
