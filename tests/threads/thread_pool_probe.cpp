// One thread pool (issue 6 item 2): OpenMP, oneDNN (built on OpenMP) and nothing else. Run as its
// own process by ctest, once per thread setting: OMP_NUM_THREADS=1 and 2, and train.threads' way
// (omp_set_num_threads, here from MOECORE_PROBE_THREADS) overriding OMP_NUM_THREADS.
// It counts the process's OS threads in /proc/self/task and, from each thread's CPU time
// (/proc/self/task/<tid>/stat), the threads that did work during an fp32 GEMM, a bf16 GEMM, a
// whole-model forward/backward and AdamW step, and a parallel region of our own. A second pool
// (OpenBLAS' pthreads, a oneDNN built on TBB, another OpenMP runtime) would show as extra threads.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "model/params.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace moecore {
namespace {

// CPU time (utime + stime, clock ticks) of every thread of this process, by tid.
std::map<int64_t, int64_t> thread_cpu_ticks() {
  std::map<int64_t, int64_t> ticks;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (stat.empty()) continue;  // the thread ended meanwhile
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    int64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    ticks[std::stoll(entry.path().filename().string())] = utime + stime;
  }
  return ticks;
}

// Runs work() repeatedly for at least `seconds` of wall time; returns the threads that accrued CPU
// time meanwhile: at least a fifth of the busiest thread's, so a thread that merely woke up for a
// barrier does not count as working, and a working one that the shared machine slowed still does.
template <typename F>
int64_t working_threads(F&& work, double seconds = 0.6) {
  const std::map<int64_t, int64_t> before = thread_cpu_ticks();
  const auto start = std::chrono::steady_clock::now();
  do {
    work();
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           seconds);
  std::map<int64_t, int64_t> delta = thread_cpu_ticks();
  int64_t busiest = 0;
  for (auto& [tid, t] : delta) {
    const auto found = before.find(tid);
    t -= found != before.end() ? found->second : 0;
    busiest = std::max(busiest, t);
  }
  int64_t working = 0;
  for (const auto& [tid, t] : delta) working += t * 5 >= busiest && t > 0 ? 1 : 0;
  return working;
}

int64_t os_threads() {
  return static_cast<int64_t>(thread_cpu_ticks().size());
}

TEST(ThreadPool, OnePoolOfTheConfiguredSize) {
  // Before anything runs: no library started threads of its own when it was loaded.
  ASSERT_EQ(os_threads(), 1) << "threads were started before main's first parallel work";
  if (const char* n = std::getenv("MOECORE_PROBE_THREADS")) omp_set_num_threads(std::atoi(n));
  const int64_t threads = omp_get_max_threads();
  std::cout << "[probe] omp_get_max_threads() = " << threads << "\n";

  // Our own parallel region: distinct OpenMP thread numbers that ran an iteration.
  std::set<int> seen;
#pragma omp parallel for schedule(static, 1)
  for (int i = 0; i < 64; ++i) {
#pragma omp critical
    seen.insert(omp_get_thread_num());
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), threads);

  const int64_t n = 384;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  auto fp32 = [&] {
    kernels::gemm_fp32(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  auto bf16 = [&] {
    kernels::gemm_bf16(kernels::bf16_gemm_path(), false, true, n, n, n, 1.0f, a.data(), n, b.data(),
                       n, 0.0f, c.data(), n);
  };

  ModelConfig config;
  config.vocab_size = 512;
  config.hidden_size = 128;
  config.moe_intermediate_size = 128;
  const ParamLayout layout = ParamLayout::build(config);
  ParamBuffers params(layout), grads(layout);
  init_params(layout, 1, params);
  Transformer model(config, layout);
  AdamW optimizer(layout, OptimConfig{});
  const int64_t batch = 4, seq = 64;
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37) % 512);
  auto step = [&] {
    grads.zero();
    model.forward(params, tokens.data(), tokens.data(), batch, seq);
    model.backward(params, grads, 1.0f);
    optimizer.step(params, grads, 1e-4);
  };
  auto bf16_step = [&] {
    model.set_precision(PrecisionRecipe::from_train_precision(kernels::MatmulPrecision::kBf16));
    step();
    model.set_precision(PrecisionRecipe{});
  };

  const int64_t fp32_workers = working_threads(fp32);
  const int64_t bf16_workers = working_threads(bf16);
  const int64_t step_workers = working_threads(step);
  const int64_t bf16_step_workers = working_threads(bf16_step);
  std::cout << "[probe] OS threads " << os_threads() << "; threads that worked: fp32 GEMM "
            << fp32_workers << ", bf16 GEMM " << bf16_workers << ", fp32 train step "
            << step_workers << ", bf16 train step " << bf16_step_workers << "\n";
  EXPECT_EQ(fp32_workers, threads);
  EXPECT_EQ(bf16_workers, threads);
  EXPECT_EQ(step_workers, threads);
  EXPECT_EQ(bf16_step_workers, threads);
  // Exactly the OpenMP pool: the main thread and threads - 1 workers, nothing else.
  EXPECT_EQ(os_threads(), threads);
}

}  // namespace
}  // namespace moecore
