// NCCL's communicator (src/dist/nccl/) on this machine's GPUs. The public collectives of a group
// of one complete in dist::Communicator without reaching the backend, so on one GPU NcclPaths, a
// subclass, calls the backend's do_* functions: the real ncclAllReduce, ncclBroadcast,
// ncclAllGather, ncclReduceScatter and grouped ncclSend / ncclRecv on one rank, on device memory
// and on host memory (staged through the communicator's device buffer). Over one rank every
// result is the input, exactly: a sum of one term, a maximum of one value, an all-to-all that
// moves each part to its displacement. Two ranks need two GPUs (NCCL refuses two ranks on one
// device): that test skips with one line on a machine with fewer.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "device_vector.h"
#include "dist/nccl/nccl_communicator.h"
#include "dist/nccl/nccl_registration.h"
#include "kernels/cuda/runtime.h"
#include "two_gpus.h"

namespace moecore::cuda_test {
namespace {

using dist::CommType;
using dist::ReduceOp;

// The communicator with the backend's operations in reach of the tests.
class NcclPaths : public dist::NcclCommunicator {
 public:
  using NcclCommunicator::do_allgather;
  using NcclCommunicator::do_allreduce;
  using NcclCommunicator::do_alltoall;
  using NcclCommunicator::do_alltoallv;
  using NcclCommunicator::do_broadcast;
  using NcclCommunicator::do_iallreduce;
  using NcclCommunicator::do_irecv;
  using NcclCommunicator::do_isend;
  using NcclCommunicator::do_reduce_scatter;
  using NcclCommunicator::NcclCommunicator;
};

// One rank on the current device, on the CUDA backend's stream.
std::unique_ptr<NcclPaths> one_rank(const std::string& name) {
  int device = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&device));
  ncclComm_t comm = nullptr;
  const ncclResult_t status = ncclCommInitAll(&comm, 1, &device);
  MOE_CHECK(status == ncclSuccess, "ncclCommInitAll: {}", ncclGetErrorString(status));
  return std::make_unique<NcclPaths>(comm, name, kernels::cuda::stream());
}

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The start-up line's library versions: the one loaded (ncclGetVersion) beside the headers', and
// what a difference costs.
TEST(NcclCommunicator, DescribesTheLibraryLoadedAndTheHeadersBuiltAgainst) {
  int loaded = 0;
  ASSERT_EQ(ncclGetVersion(&loaded), ncclSuccess);
  const auto dotted = [](int code) {
    return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
           std::to_string(code % 100);
  };
  const std::string expected =
      "NCCL " + dotted(loaded) + " loaded, built against " + dotted(NCCL_VERSION_CODE);
  const std::string line = dist::nccl::describe_library();
  EXPECT_EQ(line.rfind(expected, 0), 0u) << line;
  EXPECT_EQ(line.find("they differ") != std::string::npos, loaded != NCCL_VERSION_CODE) << line;
}

TEST(NcclCommunicator, OneRankGroupSplitsAndSynchronises) {
  const auto world = dist::NcclCommunicator::create_single("world");
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->name(), "world");
  EXPECT_EQ(world->max_tag(), std::numeric_limits<int>::max());
  world->barrier();  // ncclAllReduce of one element, then a stream synchronisation

  const auto same = world->split(0, 0, "same");  // ncclCommSplit
  EXPECT_EQ(same->rank(), 0);
  EXPECT_EQ(same->size(), 1);
  EXPECT_EQ(same->name(), "same");
  same->barrier();

  const auto none = world->split(dist::Communicator::kNoColor, 0, "none");
  EXPECT_EQ(none->size(), 1);
  none->barrier();
  EXPECT_EQ(none->split(0, 0, "still_none")->size(), 1);

  // The public operations of a group of one: nothing moves, the data stays.
  std::vector<double> stats = {1.5, -2.0};
  world->allreduce_sum(stats.data(), 2);
  EXPECT_EQ(stats, (std::vector<double>{1.5, -2.0}));
}

TEST(NcclCommunicator, WindowsAreNotImplemented) {
  const auto world = dist::NcclCommunicator::create_single("ep");
  const std::string message = message_of([&] { world->window(16); });
  EXPECT_NE(message.find("[nccl] window on group 'ep': NCCL windows are not implemented yet"),
            std::string::npos)
      << message;
}

TEST(NcclCommunicator, AllReduceOnDeviceAndHostMemory) {
  const auto comm = one_rank("dp");
  const std::vector<float> floats = {1.5f, -2.0f, 3.25f, 1e-30f};
  DeviceVector<float> on_device(floats);
  comm->do_allreduce(on_device.data(), 4, CommType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(on_device.to_host(), floats);

  DeviceVector<double> maxima(std::vector<double>{-1.0, 7.5});
  comm->do_allreduce(maxima.data(), 2, CommType::kFloat64, ReduceOp::kMax);
  EXPECT_EQ(maxima.to_host(), (std::vector<double>{-1.0, 7.5}));

  // Host memory: staged, and complete when the call returns.
  std::vector<double> stats = {0.25, -3.0, 1e300};
  comm->do_allreduce(stats.data(), 3, CommType::kFloat64, ReduceOp::kSum);
  EXPECT_EQ(stats, (std::vector<double>{0.25, -3.0, 1e300}));
  std::vector<int64_t> tokens = {int64_t{1} << 40, -5};
  comm->do_allreduce(tokens.data(), 2, CommType::kInt64, ReduceOp::kMax);
  EXPECT_EQ(tokens, (std::vector<int64_t>{int64_t{1} << 40, -5}));
  // A larger operation grows the staging buffer.
  std::vector<float> large(100000);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<float>(i) * 0.5f;
  const std::vector<float> expected = large;
  comm->do_allreduce(large.data(), static_cast<int64_t>(large.size()), CommType::kFloat32,
                     ReduceOp::kSum);
  EXPECT_EQ(large, expected);
}

TEST(NcclCommunicator, BytesAreBroadcastButNotReduced) {
  const auto comm = one_rank("world");
  std::vector<uint8_t> id = {1, 2, 3, 250};
  comm->do_broadcast(id.data(), 4, 0);
  EXPECT_EQ(id, (std::vector<uint8_t>{1, 2, 3, 250}));
  DeviceVector<uint8_t> on_device(id);
  comm->do_broadcast(on_device.data(), 4, 0);
  EXPECT_EQ(on_device.to_host(), id);

  const std::string message =
      message_of([&] { comm->do_allreduce(id.data(), 4, CommType::kByte, ReduceOp::kSum); });
  EXPECT_NE(message.find("[nccl] allreduce on group 'world': bytes cannot be reduced"),
            std::string::npos)
      << message;
}

TEST(NcclCommunicator, AllGatherAndReduceScatter) {
  const auto comm = one_rank("ep");
  DeviceVector<float> send(std::vector<float>{1.0f, -2.0f, 3.0f});
  DeviceVector<float> gathered(std::vector<float>(3, 0.0f));
  comm->do_allgather(send.data(), gathered.data(), 3, CommType::kFloat32);
  EXPECT_EQ(gathered.to_host(), (std::vector<float>{1.0f, -2.0f, 3.0f}));

  DeviceVector<float> scattered(std::vector<float>(3, 0.0f));
  comm->do_reduce_scatter(send.data(), scattered.data(), 3, CommType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(scattered.to_host(), (std::vector<float>{1.0f, -2.0f, 3.0f}));

  // Host on one side, device on the other: the host side is staged, the call waits.
  const std::vector<int64_t> counts = {4, 0, 9};
  DeviceVector<int64_t> gathered_counts(std::vector<int64_t>(3, -1));
  comm->do_allgather(counts.data(), gathered_counts.data(), 3, CommType::kInt64);
  EXPECT_EQ(gathered_counts.to_host(), counts);

  const std::vector<double> partial = {2.5, -0.5};
  std::vector<double> maxima(2, 0.0);
  comm->do_reduce_scatter(partial.data(), maxima.data(), 2, CommType::kFloat64, ReduceOp::kMax);
  EXPECT_EQ(maxima, partial);
}

TEST(NcclCommunicator, AllToAllGroupsSendsAndReceives) {
  const auto comm = one_rank("ep");
  // Three elements from send[2..5) to recv[1..4): one ncclSend and one ncclRecv to this rank, in
  // one group; the rest of recv keeps its values.
  const std::vector<float> send = {0.0f, 0.0f, 7.0f, 8.0f, 9.0f};
  const std::vector<int64_t> send_counts = {3}, send_displs = {2};
  const std::vector<int64_t> recv_counts = {3}, recv_displs = {1};
  const std::vector<float> expected = {-1.0f, 7.0f, 8.0f, 9.0f, -1.0f};

  DeviceVector<float> send_on_device(send);
  DeviceVector<float> recv_on_device(std::vector<float>(5, -1.0f));
  comm->do_alltoallv(send_on_device.data(), send_counts, send_displs, recv_on_device.data(),
                     recv_counts, recv_displs, CommType::kFloat32);
  EXPECT_EQ(recv_on_device.to_host(), expected);

  std::vector<float> recv_on_host(5, -1.0f);
  comm->do_alltoallv(send.data(), send_counts, send_displs, recv_on_host.data(), recv_counts,
                     recv_displs, CommType::kFloat32);
  EXPECT_EQ(recv_on_host, expected);

  // Nothing to send: no NCCL call, and recv untouched.
  const std::vector<int64_t> none = {0};
  comm->do_alltoallv(send.data(), none, none, recv_on_host.data(), none, none, CommType::kFloat32);
  EXPECT_EQ(recv_on_host, expected);

  const std::vector<int64_t> offsets = {12, -3};
  std::vector<int64_t> exchanged(2, 0);
  comm->do_alltoall(offsets.data(), exchanged.data(), 2, CommType::kInt64);
  EXPECT_EQ(exchanged, offsets);
}

TEST(NcclCommunicator, NonBlockingAllReduceOnDeviceMemory) {
  const auto comm = one_rank("dp");
  DeviceVector<float> grads(std::vector<float>{0.5f, -4.0f});
  dist::Request request = comm->do_iallreduce(grads.data(), 2, CommType::kFloat32, ReduceOp::kSum);
  ASSERT_NE(request, nullptr);
  while (!dist::test(request)) {
  }
  EXPECT_EQ(grads.to_host(), (std::vector<float>{0.5f, -4.0f}));

  request = comm->do_iallreduce(grads.data(), 2, CommType::kFloat32, ReduceOp::kMax);
  dist::wait(request);
  EXPECT_EQ(grads.to_host(), (std::vector<float>{0.5f, -4.0f}));
}

TEST(NcclCommunicator, NonBlockingOperationsRejectHostMemory) {
  const auto comm = one_rank("pp");
  std::vector<float> activations(8, 1.0f);
  std::string message = message_of(
      [&] { comm->do_iallreduce(activations.data(), 8, CommType::kFloat32, ReduceOp::kSum); });
  EXPECT_NE(message.find("[nccl] iallreduce on group 'pp': "), std::string::npos) << message;
  EXPECT_NE(message.find("is host memory"), std::string::npos) << message;
  message = message_of([&] { comm->do_isend(activations.data(), 8, CommType::kFloat32, 0, 0); });
  EXPECT_NE(message.find("[nccl] isend on group 'pp': "), std::string::npos) << message;
  message = message_of([&] { comm->do_irecv(activations.data(), 8, CommType::kFloat32, 0, 0); });
  EXPECT_NE(message.find("[nccl] irecv on group 'pp': "), std::string::npos) << message;
}

// Two ranks, one thread and one device each, in one process (ncclCommInitAll). The threads call
// the backend's operations directly: the traffic counters of the public ones belong to the main
// thread only (dist/traffic_counters.h).
TEST(NcclCommunicator, TwoGpusAllReduceAndSendReceive) {
  if (const std::string why = cuda_test::fewer_than_two_gpus(); !why.empty()) GTEST_SKIP() << why;
  std::vector<ncclComm_t> comms(2, nullptr);
  const int device_list[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, device_list), ncclSuccess);

  struct Result {
    std::vector<float> summed;
    std::vector<double> maxima;
    std::vector<float> received;
    std::string error;
  };
  std::vector<Result> results(2);
  auto rank_main = [&](int rank) {
    Result& result = results[static_cast<size_t>(rank)];
    cudaStream_t stream = nullptr;
    try {
      MOE_CUDA_CHECK(cudaSetDevice(rank));
      MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      NcclPaths comm(comms[static_cast<size_t>(rank)], "pair", stream);
      const float r = static_cast<float>(rank);
      DeviceVector<float> values(std::vector<float>{r + 1.0f, 10.0f * (r + 1.0f)}, stream);
      comm.do_allreduce(values.data(), 2, CommType::kFloat32, ReduceOp::kSum);
      result.summed = values.to_host();

      std::vector<double> stats = {static_cast<double>(rank), -static_cast<double>(rank)};
      comm.do_allreduce(stats.data(), 2, CommType::kFloat64, ReduceOp::kMax);
      result.maxima = stats;

      DeviceVector<float> message(std::vector<float>{r + 0.5f, r - 0.5f, 3.0f}, stream);
      dist::Request request = rank == 0
                                  ? comm.do_isend(message.data(), 3, CommType::kFloat32, 1, 0)
                                  : comm.do_irecv(message.data(), 3, CommType::kFloat32, 0, 0);
      dist::wait(request);
      result.received = message.to_host();
    } catch (const std::exception& e) {
      result.error = e.what();
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  };
  std::thread first(rank_main, 0), second(rank_main, 1);
  first.join();
  second.join();

  for (const Result& result : results) {
    EXPECT_EQ(result.error, "");
    EXPECT_EQ(result.summed, (std::vector<float>{3.0f, 30.0f}));
    EXPECT_EQ(result.maxima, (std::vector<double>{1.0, 0.0}));
    EXPECT_EQ(result.received, (std::vector<float>{0.5f, -0.5f, 3.0f}));
  }
}

}  // namespace
}  // namespace moecore::cuda_test
