// NCCL's communicator and its symmetric exchange across two ranks that are processes with one GPU
// each (mpirun -n 2: ctest CudaSim.TwoRanks on cudasim's GPUs and NCCL, and Cuda.TwoRanks on a
// machine with two GPUs). The oracle is MPI's communicator over the same two processes: every
// collective's result must equal MPI's bit for bit (a reduction over two ranks adds two terms,
// the same in either order). The sizes pass the emulated NCCL's 256 KiB rings, so messages wrap;
// an all-to-all-v leaves gaps that must come back unchanged. The exchange moves blocks that name
// their source, destination, place and round, eager and replayed in a graph. Outside two
// processes, or where the two share a GPU, each test skips with one line.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_vector.h"
#include "dist/device_communicators.h"
#include "dist/mpi/mpi_runtime.h"
#include "dist/nccl/nccl_communicator.h"
#include "dist/nccl/nccl_registration.h"
#include "gradcheck.h"
#include "kernels/cuda/device_selection.h"
#include "kernels/cuda/runtime.h"

namespace moecore::cuda_test::ranks {
namespace {

using dist::CommType;
using dist::ReduceOp;
using gradcheck::random_vec;

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// MPI's world and NCCL's over it, on this rank's GPU; `why_not` says why the test cannot run.
class NcclRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    mpi_ = dist::mpi_world();
    if (mpi_->size() != 2) {
      why_not_ = "runs in 2 processes (mpirun -n 2)";
      return;
    }
    (void)kernels::cuda::activate();
    const dist::DeviceCommunicatorFactory* previous = dist::device_communicator(Device::kCuda);
    dist::nccl::register_communicator();
    why_not_ = dist::device_communicator(Device::kCuda)->unusable(*mpi_);
    dist::register_device_communicator(Device::kCuda, previous);
    if (why_not_.empty()) nccl_ = dist::NcclCommunicator::create(*mpi_, "world");
  }

  int rank() const { return mpi_->rank(); }

  std::unique_ptr<dist::Communicator> mpi_;
  std::unique_ptr<dist::NcclCommunicator> nccl_;
  std::string why_not_;
};

TEST_F(NcclRanks, ranks2_reductions_equal_mpis_on_device_and_host_memory) {
  if (!why_not_.empty()) GTEST_SKIP() << why_not_;
  // 100003 floats: 400 KB, more than a ring holds; values of both signs and magnitudes.
  const std::vector<float> floats = random_vec(100003, 11u + static_cast<uint32_t>(rank()));
  std::vector<float> expected = floats;
  mpi_->allreduce_sum(expected.data(), static_cast<int64_t>(expected.size()));

  DeviceVector<float> on_device(floats);
  nccl_->allreduce_sum(on_device.data(), static_cast<int64_t>(floats.size()));
  EXPECT_TRUE(same_bits(on_device.to_host(), expected)) << "sum of floats in device memory";
  std::vector<float> on_host = floats;
  nccl_->allreduce_sum(on_host.data(), static_cast<int64_t>(on_host.size()));
  EXPECT_TRUE(same_bits(on_host, expected)) << "sum of floats in host memory (staged)";

  std::vector<double> maxima = {rank() == 0 ? -1.0 : 2.5, rank() == 0 ? 1e300 : -1e300, 0.0};
  std::vector<double> maxima_expected = maxima;
  mpi_->allreduce_max(maxima_expected.data(), 3);
  nccl_->allreduce_max(maxima.data(), 3);
  EXPECT_EQ(maxima, maxima_expected);
  EXPECT_EQ(maxima, (std::vector<double>{2.5, 1e300, 0.0}));

  std::vector<int64_t> counts = {int64_t{1} << 40, -5 - rank(), rank()};
  DeviceVector<int64_t> counts_on_device(counts);
  nccl_->allreduce_sum(counts_on_device.data(), 3);
  EXPECT_EQ(counts_on_device.to_host(), (std::vector<int64_t>{int64_t{1} << 41, -11, 1}));

  // The non-blocking form on device memory: complete once waited for.
  DeviceVector<float> pending(floats);
  dist::Request request =
      nccl_->iallreduce_sum(pending.data(), static_cast<int64_t>(floats.size()));
  request->wait();
  EXPECT_TRUE(same_bits(pending.to_host(), expected)) << "iallreduce";
}

TEST_F(NcclRanks, ranks2_broadcast_gather_and_scatter_equal_mpis) {
  if (!why_not_.empty()) GTEST_SKIP() << why_not_;
  // Broadcast from rank 1 of 300001 bytes.
  std::vector<uint8_t> bytes(300001);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(rank() == 1 ? i * 7 + 3 : 0xab);
  std::vector<uint8_t> bytes_expected = bytes;
  mpi_->broadcast(bytes_expected.data(), static_cast<int64_t>(bytes.size()), 1);
  DeviceVector<uint8_t> bytes_on_device(bytes);
  nccl_->broadcast(bytes_on_device.data(), static_cast<int64_t>(bytes.size()), 1);
  EXPECT_EQ(bytes_on_device.to_host(), bytes_expected);

  // All-gather and reduce-scatter of 70001 floats per rank, device and host memory.
  const std::vector<float> part = random_vec(70001, 21u + static_cast<uint32_t>(rank()));
  std::vector<float> gathered_expected(2 * part.size());
  mpi_->allgather(part.data(), gathered_expected.data(), static_cast<int64_t>(part.size()));
  DeviceVector<float> part_on_device(part), gathered(std::vector<float>(2 * part.size(), -1.0f));
  nccl_->allgather(part_on_device.data(), gathered.data(), static_cast<int64_t>(part.size()));
  EXPECT_TRUE(same_bits(gathered.to_host(), gathered_expected)) << "allgather";

  const std::vector<float> whole = random_vec(2 * 70001, 31u + static_cast<uint32_t>(rank()));
  std::vector<float> scattered_expected(70001);
  mpi_->reduce_scatter_sum(whole.data(), scattered_expected.data(), 70001);
  DeviceVector<float> whole_on_device(whole), scattered(std::vector<float>(70001, -1.0f));
  nccl_->reduce_scatter_sum(whole_on_device.data(), scattered.data(), 70001);
  EXPECT_TRUE(same_bits(scattered.to_host(), scattered_expected)) << "reduce_scatter on device";
  std::vector<float> scattered_on_host(70001, -1.0f);
  nccl_->reduce_scatter_sum(whole.data(), scattered_on_host.data(), 70001);
  EXPECT_TRUE(same_bits(scattered_on_host, scattered_expected)) << "reduce_scatter on host";
}

TEST_F(NcclRanks, ranks2_all_to_all_v_sends_receives_and_keeps_the_gaps) {
  if (!why_not_.empty()) GTEST_SKIP() << why_not_;
  // Uneven parts (rank 0 sends 3 to itself and 90000 to rank 1; rank 1 sends 5000 and 0), at
  // displacements with gaps between them; the receive buffer's gaps hold -7 and must keep it.
  const std::vector<std::vector<int64_t>> sends = {{3, 90000}, {5000, 0}};
  const std::vector<int64_t>& send_counts = sends[static_cast<size_t>(rank())];
  const std::vector<int64_t> send_displs = {1, send_counts[0] + 4};
  const std::vector<int64_t> recv_counts = {sends[0][static_cast<size_t>(rank())],
                                            sends[1][static_cast<size_t>(rank())]};
  const std::vector<int64_t> recv_displs = {2, recv_counts[0] + 9};
  const std::vector<float> send = random_vec(static_cast<size_t>(send_displs[1] + send_counts[1]),
                                             41u + static_cast<uint32_t>(rank()));
  const std::vector<float> gaps(static_cast<size_t>(recv_displs[1] + recv_counts[1] + 3), -7.0f);
  std::vector<float> expected = gaps;
  mpi_->alltoallv(send.data(), send_counts, send_displs, expected.data(), recv_counts, recv_displs);
  DeviceVector<float> send_on_device(send), recv(gaps);
  nccl_->alltoallv(send_on_device.data(), send_counts, send_displs, recv.data(), recv_counts,
                   recv_displs);
  EXPECT_TRUE(same_bits(recv.to_host(), expected));

  // Point to point: rank 0 sends first, rank 1 receives first (NCCL's sends and receives block
  // the stream until their peer's match).
  const std::vector<float> message = random_vec(80000, 51u + static_cast<uint32_t>(rank()));
  DeviceVector<float> outgoing(message), incoming(std::vector<float>(80000, 0.0f));
  const int peer = 1 - rank();
  if (rank() == 0) {
    nccl_->isend(outgoing.data(), 80000, peer, 0)->wait();
    nccl_->irecv(incoming.data(), 80000, peer, 0)->wait();
  } else {
    nccl_->irecv(incoming.data(), 80000, peer, 0)->wait();
    nccl_->isend(outgoing.data(), 80000, peer, 0)->wait();
  }
  std::vector<float> peers_message(80000);
  if (rank() == 0) {
    mpi_->isend(message.data(), 80000, peer, 5)->wait();
    mpi_->irecv(peers_message.data(), 80000, peer, 6)->wait();
  } else {
    mpi_->irecv(peers_message.data(), 80000, peer, 5)->wait();
    mpi_->isend(message.data(), 80000, peer, 6)->wait();
  }
  EXPECT_TRUE(same_bits(incoming.to_host(), peers_message)) << "send and receive";
}

TEST_F(NcclRanks, ranks2_splits_order_ranks_by_key_and_leave_out_no_color) {
  if (!why_not_.empty()) GTEST_SKIP() << why_not_;
  // One group, ranks reversed by key: rank 1 of the world is rank 0 of the split.
  const auto reversed = nccl_->split(0, -rank(), "reversed");
  EXPECT_EQ(reversed->size(), 2);
  EXPECT_EQ(reversed->rank(), 1 - rank());
  std::vector<int64_t> order(2);
  const int64_t mine = rank();
  reversed->allgather(&mine, order.data(), 1);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 0}));
  reversed->barrier();
  // A group of each rank alone, and rank 1 left out.
  const auto alone = nccl_->split(rank(), 0, "alone");
  EXPECT_EQ(alone->size(), 1);
  alone->barrier();
  const auto only_rank0 = nccl_->split(rank() == 0 ? 0 : dist::Communicator::kNoColor, 0, "r0");
  EXPECT_EQ(only_rank0->size(), 1);
  nccl_->barrier();
}

#if MOECORE_NCCL_DEVICE_API
// Element i of rank s's block for rank d in round n: every received value names its place.
float block_value(int source, int destination, int64_t i, int round) {
  return static_cast<float>(i) + 0.5f * static_cast<float>(source) +
         0.25f * static_cast<float>(destination) + 0.0625f * static_cast<float>(round);
}

std::vector<float> blocks_from(int source, int64_t block, int round) {
  std::vector<float> send(2 * static_cast<size_t>(block));
  for (int d = 0; d < 2; ++d)
    for (int64_t i = 0; i < block; ++i)
      send[static_cast<size_t>(d * block + i)] = block_value(source, d, i, round);
  return send;
}

std::vector<float> blocks_to(int destination, int64_t block, int round) {
  std::vector<float> recv(2 * static_cast<size_t>(block));
  for (int s = 0; s < 2; ++s)
    for (int64_t i = 0; i < block; ++i)
      recv[static_cast<size_t>(s * block + i)] = block_value(s, destination, i, round);
  return recv;
}

TEST_F(NcclRanks, ranks2_block_exchange_moves_each_block_to_its_rank_eager_and_replayed) {
  if (!why_not_.empty()) GTEST_SKIP() << why_not_;
  const auto exchange = nccl_->device_block_exchange();
  const cudaStream_t stream = kernels::cuda::stream();
  // Vectors, the scalar copy, fewer floats than CTAs, and a window that grows (past 2 MiB).
  int round = 0;
  for (const int64_t block : {4096L, 1001L, 7L, 300000L, 64L}) {
    ++round;
    DeviceVector<float> send(blocks_from(rank(), block, round), stream);
    DeviceVector<float> recv(std::vector<float>(2 * static_cast<size_t>(block), -1.0f), stream);
    exchange->exchange(send.data(), recv.data(), block);
    EXPECT_TRUE(same_bits(recv.to_host(), blocks_to(rank(), block, round)))
        << "block of " << block << " floats";
  }

  // Captured once, replayed with new contents: each round's blocks arrive, none of the last's.
  constexpr int64_t kBlock = 5000;
  DeviceVector<float> send(blocks_from(rank(), kBlock, 0), stream);
  DeviceVector<float> recv(std::vector<float>(2 * kBlock, -1.0f), stream);
  exchange->exchange(send.data(), recv.data(), kBlock);
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  exchange->exchange(send.data(), recv.data(), kBlock);
  MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t replay = nullptr;
  MOE_CUDA_CHECK(cudaGraphInstantiate(&replay, graph, 0));
  for (int replayed = 1; replayed <= 3; ++replayed) {
    send.write(blocks_from(rank(), kBlock, 10 + replayed));
    recv.write(std::vector<float>(2 * kBlock, -1.0f));
    MOE_CUDA_CHECK(cudaGraphLaunch(replay, stream));
    EXPECT_TRUE(same_bits(recv.to_host(), blocks_to(rank(), kBlock, 10 + replayed)))
        << "replay " << replayed;
  }
  MOE_CUDA_CHECK(cudaGraphExecDestroy(replay));
  MOE_CUDA_CHECK(cudaGraphDestroy(graph));
}
#endif

}  // namespace
}  // namespace moecore::cuda_test::ranks
