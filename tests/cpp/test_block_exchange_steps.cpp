// The symmetric block exchange's steps (dist/block_exchange_steps.h), which the CUDA kernel runs
// on NCCL's windows and LSA barriers, run here on the CPU: one thread for every (rank, CTA), an
// array for every rank's window, and for every CTA index a std::barrier of the ranks' threads
// that have it. Every rank's receive buffer must be the all-to-all of the send buffers, for 1-4
// ranks, 1-32 CTAs, blocks smaller than the CTAs' slices and not multiples of 4, over several
// rounds that reuse the windows with new data (a CTA may start the next round while other CTAs
// of its rank still copy out: stricter than the GPU, where a rank's kernels run one at a time).
// What this cannot show, NCCL's API and the GPU's memory ordering, tests/cuda's
// test_nccl_block_exchange.cpp does on GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "dist/block_exchange_steps.h"

namespace moecore {
namespace {

// block_exchange_steps.h's Memory for one (rank, CTA) thread.
class ThreadMemory {
 public:
  ThreadMemory(std::vector<std::vector<float>>& windows, int rank, std::barrier<>& barrier)
      : windows_(windows), rank_(rank), barrier_(barrier) {}

  float* peer_window(int peer) const { return windows_[static_cast<size_t>(peer)].data(); }
  const float* own_window() const { return windows_[static_cast<size_t>(rank_)].data(); }
  void copy(const float* from, float* to, int64_t n) const { std::copy(from, from + n, to); }
  void sync_relaxed() { barrier_.arrive_and_wait(); }
  void sync_acq_rel() { barrier_.arrive_and_wait(); }

 private:
  std::vector<std::vector<float>>& windows_;
  int rank_;
  std::barrier<>& barrier_;
};

// Rank r's send buffer of round n: element i of its block for peer p is a value that names all
// four (exact in a float for these sizes).
float sent_value(int round, int rank, int peer, int64_t i) {
  return static_cast<float>(i) + 0.5f * static_cast<float>(rank) +
         0.25f * static_cast<float>(peer) + 0.0625f * static_cast<float>(round);
}

TEST(BlockExchangeSteps, SlicesCoverEveryBlockOnceInAlignedPieces) {
  for (int64_t ctas : {1, 3, 32})
    for (int64_t block : {0, 1, 7, 64, 1001, 4096, 300000}) {
      int64_t covered = 0;
      for (int64_t cta = 0; cta < ctas; ++cta) {
        const dist::BlockSlice slice = dist::block_exchange_slice(block, cta, ctas);
        ASSERT_LE(slice.begin, slice.end);
        if (slice.end > slice.begin) {
          EXPECT_EQ(slice.begin, covered) << "block " << block << ", CTA " << cta;
          EXPECT_EQ(slice.begin % 4, 0);
          covered = slice.end;
        }
      }
      EXPECT_EQ(covered, block) << "block " << block << " over " << ctas << " CTAs";
    }
}

TEST(BlockExchangeSteps, EveryRankReceivesEverySourcesBlockForIt) {
  constexpr int kRounds = 3;
  for (int ranks : {1, 2, 3, 4})
    for (int ctas : {1, 3, 32})
      for (int64_t block : {1, 7, 1001, 4096}) {
        const size_t floats = static_cast<size_t>(ranks * block);
        std::vector<std::vector<float>> windows(static_cast<size_t>(ranks),
                                                std::vector<float>(floats, -1.0f));
        // send[round][rank], recv[round][rank]: the callers' buffers.
        std::vector<std::vector<std::vector<float>>> send(kRounds), recv(kRounds);
        for (int round = 0; round < kRounds; ++round)
          for (int rank = 0; rank < ranks; ++rank) {
            std::vector<float> values(floats);
            for (int peer = 0; peer < ranks; ++peer)
              for (int64_t i = 0; i < block; ++i)
                values[static_cast<size_t>(peer * block + i)] = sent_value(round, rank, peer, i);
            send[round].push_back(values);
            recv[round].emplace_back(floats, -2.0f);
          }
        std::vector<std::unique_ptr<std::barrier<>>> barriers;
        for (int cta = 0; cta < ctas; ++cta)
          barriers.push_back(std::make_unique<std::barrier<>>(ranks));
        std::vector<std::thread> threads;
        for (int rank = 0; rank < ranks; ++rank)
          for (int cta = 0; cta < ctas; ++cta)
            threads.emplace_back([&, rank, cta] {
              ThreadMemory memory(windows, rank, *barriers[static_cast<size_t>(cta)]);
              for (int round = 0; round < kRounds; ++round)
                dist::block_exchange_cta(memory, rank, ranks, block, cta, ctas,
                                         send[round][static_cast<size_t>(rank)].data(),
                                         recv[round][static_cast<size_t>(rank)].data());
            });
        for (std::thread& thread : threads) thread.join();

        for (int round = 0; round < kRounds; ++round)
          for (int rank = 0; rank < ranks; ++rank) {
            std::vector<float> expected(floats);
            for (int source = 0; source < ranks; ++source)
              for (int64_t i = 0; i < block; ++i)
                expected[static_cast<size_t>(source * block + i)] =
                    sent_value(round, source, rank, i);
            EXPECT_EQ(recv[round][static_cast<size_t>(rank)], expected)
                << ranks << " ranks, " << ctas << " CTAs, block " << block << ", round " << round
                << ", rank " << rank;
          }
      }
}

}  // namespace
}  // namespace moecore
