// The symmetric transport's device-initiated all-to-all (dist/nccl/nccl_block_exchange.h) on this
// machine's GPUs: NCCL's device communicator, its symmetric window, and the kernel that stores
// each block into its destination's window and copies its own window out. On one GPU the group
// has one rank and the kernel stores into this GPU's own window through NCCL's load/store
// pointer: every result equals the input bit for bit, at every size (the vectorised and the
// scalar copy, the window grown), in a CUDA graph's replay, and growing inside a capture is one
// line. Two ranks need two GPUs (NCCL refuses two ranks on one device): that test skips with one
// line on a machine with fewer.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "device_vector.h"
#include "dist/nccl/nccl_communicator.h"
#include "gradcheck.h"
#include "kernels/cuda/runtime.h"
#include "two_gpus.h"

namespace moecore::cuda_test::block_exchange {
namespace {

using gradcheck::random_vec;

#if MOECORE_NCCL_DEVICE_API

// A NaN pattern in recv before each exchange: an element the kernel does not write stays NaN.
std::vector<float> poison(size_t count) {
  return std::vector<float>(count, std::nanf(""));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The library the kernel's inlined device API was built for, or why this machine has another.
std::string library_mismatch() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "ncclGetVersion failed";
  if (version == NCCL_VERSION_CODE) return "";
  return "NCCL at run time is version code " + std::to_string(version) + ", built against " +
         std::to_string(NCCL_VERSION_CODE);
}

TEST(NcclBlockExchange, OneRankStoresEveryBlockIntoItsOwnWindow) {
  if (const std::string why = library_mismatch(); !why.empty()) GTEST_SKIP() << why;
  const auto ep = dist::NcclCommunicator::create_single("ep");
  const auto exchange = ep->device_block_exchange();
  const cudaStream_t stream = kernels::cuda::stream();
  // 16-byte vectors, the scalar copy (an odd block), fewer floats than CTAs, and a block past the
  // first window's 2 MiB (it grows), then a small one again in the grown window.
  for (const int64_t block : {4096L, 1001L, 7L, 1200000L, 64L}) {
    const std::vector<float> sent = random_vec(static_cast<size_t>(block), 7u + block);
    DeviceVector<float> send(sent, stream), recv(poison(sent.size()), stream);
    exchange->exchange(send.data(), recv.data(), block);
    EXPECT_TRUE(same_bits(recv.to_host(), sent)) << "block of " << block << " floats";
  }
}

TEST(NcclBlockExchange, ReplaysInACudaGraphAndRefusesToGrowInsideACapture) {
  if (const std::string why = library_mismatch(); !why.empty()) GTEST_SKIP() << why;
  const auto ep = dist::NcclCommunicator::create_single("ep");
  const auto exchange = ep->device_block_exchange();
  const cudaStream_t stream = kernels::cuda::stream();
  constexpr int64_t kBlock = 65536;
  DeviceVector<float> send(random_vec(kBlock, 1), stream), recv(poison(kBlock), stream);
  exchange->exchange(send.data(), recv.data(), kBlock);  // sizes the window outside the capture
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  exchange->exchange(send.data(), recv.data(), kBlock);
  MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t replay = nullptr;
  MOE_CUDA_CHECK(cudaGraphInstantiate(&replay, graph, 0));
  for (uint32_t seed = 2; seed < 5; ++seed) {  // new contents each time, the same addresses
    const std::vector<float> sent = random_vec(kBlock, seed);
    send.write(sent);
    recv.write(poison(kBlock));
    MOE_CUDA_CHECK(cudaGraphLaunch(replay, stream));
    EXPECT_TRUE(same_bits(recv.to_host(), sent)) << "replay with seed " << seed;
  }

  // A block larger than the window, first seen inside a capture.
  constexpr int64_t kLarger = 4 << 20;
  DeviceVector<float> large_send(poison(kLarger), stream), large_recv(poison(kLarger), stream);
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string message = "(no error)";
  try {
    exchange->exchange(large_send.data(), large_recv.data(), kLarger);
  } catch (const Error& e) {
    message = e.what();
  }
  cudaGraph_t abandoned = nullptr;
  cudaStreamEndCapture(stream, &abandoned);
  if (abandoned != nullptr) cudaGraphDestroy(abandoned);
  cudaGetLastError();
  EXPECT_NE(message.find("inside a device graph's capture"), std::string::npos) << message;

  // Grown outside a capture, the window is a new one; the graph captured on the old one still
  // replays right (the outgrown window stays registered until the exchange goes).
  const std::vector<float> large = random_vec(kLarger, 5);
  large_send.write(large);
  exchange->exchange(large_send.data(), large_recv.data(), kLarger);
  EXPECT_TRUE(same_bits(large_recv.to_host(), large));
  const std::vector<float> again = random_vec(kBlock, 6);
  send.write(again);
  recv.write(poison(kBlock));
  MOE_CUDA_CHECK(cudaGraphLaunch(replay, stream));
  EXPECT_TRUE(same_bits(recv.to_host(), again)) << "the old graph after the window grew";
  MOE_CUDA_CHECK(cudaGraphExecDestroy(replay));
  MOE_CUDA_CHECK(cudaGraphDestroy(graph));
}

// Two ranks in one process, one thread and one GPU each: in round n rank r's block for rank p
// holds i + r / 2 + p / 4 + n / 16 at element i, so every received element names its place, its
// source, its destination and its round. Each round's result is checked: a barrier that let a rank
// read its window before the peer's stores landed, or a peer overwrite it before it was read, shows
// as the previous round's values or the poison. The blocks change size between rounds (the
// window grows at the third).
TEST(NcclBlockExchange, TwoGpusEachReceiveTheOthersBlock) {
  if (const std::string why = cuda_test::fewer_than_two_gpus(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = library_mismatch(); !why.empty()) GTEST_SKIP() << why;
  std::vector<ncclComm_t> comms(2, nullptr);
  const int device_list[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, device_list), ncclSuccess);
  const std::vector<int64_t> blocks = {300000, 1001, 700000, 300000};
  // Exact in a float: i < 2^20 and four bits of fraction, 24 bits in all.
  auto value = [](int source, int destination, int round, int64_t i) {
    return static_cast<float>(i) + 0.5f * static_cast<float>(source) +
           0.25f * static_cast<float>(destination) + 0.0625f * static_cast<float>(round);
  };

  // Two blocks of `block` floats, element i of block b being element(b, i).
  auto two_blocks = [](int64_t block, const auto& element) {
    std::vector<float> floats(2 * static_cast<size_t>(block));
    for (int b = 0; b < 2; ++b)
      for (int64_t i = 0; i < block; ++i)
        floats[static_cast<size_t>(b * block + i)] = element(b, i);
    return floats;
  };
  // received[rank][round]
  std::vector<std::vector<std::vector<float>>> received(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    cudaStream_t stream = nullptr;
    try {
      MOE_CUDA_CHECK(cudaSetDevice(rank));
      MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      {
        dist::NcclCommunicator comm(comms[static_cast<size_t>(rank)], "ep", stream);
        const auto exchange = comm.device_block_exchange();
        for (int round = 0; round < static_cast<int>(blocks.size()); ++round) {
          const int64_t block = blocks[static_cast<size_t>(round)];
          const std::vector<float> sent =
              two_blocks(block, [&](int peer, int64_t i) { return value(rank, peer, round, i); });
          DeviceVector<float> send(sent, stream), recv(poison(sent.size()), stream);
          exchange->exchange(send.data(), recv.data(), block);
          received[static_cast<size_t>(rank)].push_back(recv.to_host());
        }
      }
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  };
  std::thread first(rank_main, 0), second(rank_main, 1);
  first.join();
  second.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(errors[static_cast<size_t>(rank)], "");
    ASSERT_EQ(received[static_cast<size_t>(rank)].size(), blocks.size()) << "rank " << rank;
    for (int round = 0; round < static_cast<int>(blocks.size()); ++round) {
      const int64_t block = blocks[static_cast<size_t>(round)];
      const std::vector<float> expected =
          two_blocks(block, [&](int source, int64_t i) { return value(source, rank, round, i); });
      EXPECT_TRUE(
          same_bits(received[static_cast<size_t>(rank)][static_cast<size_t>(round)], expected))
          << "rank " << rank << ", round " << round;
    }
  }
}

#else

TEST(NcclBlockExchange, RefusedInOneLineWithoutTheDeviceApi) {
  const auto ep = dist::NcclCommunicator::create_single("ep");
  std::string message = "(no error)";
  try {
    ep->device_block_exchange();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("has no device API"), std::string::npos) << message;
}

#endif

}  // namespace
}  // namespace moecore::cuda_test::block_exchange
