// cudasim's NCCL (nccl_sim.cpp), its own checks shown to fire on a communicator of one rank:
// messages carry their operation, size and arguments, and a receive that meets another ends the
// process naming both (NCCL would hang or corrupt); an operand outside the device's memory is the
// device's illegal address; buffers that overlap other than in place (where the GPU would race)
// and what the emulation does not do are refused in one line, not run wrongly. Its results across
// ranks are shown by the *ranks2* tests (ctest CudaSim.TwoRanks).
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <string>
#include <vector>

#include "sim_state.h"

namespace cudasim_checks {
namespace {

class CudasimNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    const int device = 0;
    ASSERT_EQ(ncclCommInitAll(&comm_, 1, &device), ncclSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&device_floats_, 64 * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    cudaFree(device_floats_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
    cudasim::clear_errors();
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* device_floats_ = nullptr;
};

using CudasimNcclDeathTest = CudasimNccl;

TEST_F(CudasimNcclDeathTest, AReceiveOfAnotherSizeEndsTheProcessNamingBoth) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ncclGroupStart();
        ncclSend(device_floats_, 4, ncclFloat32, 0, comm_, stream_);
        ncclRecv(device_floats_ + 8, 8, ncclFloat32, 0, comm_, stream_);
        ncclGroupEnd();
      },
      "cudasim: NCCL: rank 0 of communicator cudasim-nccl-single-.* expected ncclSend/ncclRecv "
      "of 32 bytes \\(data type 7\\) from rank 0, which sent ncclSend/ncclRecv of 16 bytes "
      "\\(data type 7\\): the ranks issued different operations");
}

TEST_F(CudasimNcclDeathTest, AReceiveOfAnotherDataTypeEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ncclGroupStart();
        ncclSend(device_floats_, 4, ncclFloat32, 0, comm_, stream_);
        ncclRecv(device_floats_ + 8, 2, ncclFloat64, 0, comm_, stream_);
        ncclGroupEnd();
      },
      "expected ncclSend/ncclRecv of 16 bytes \\(data type 8\\) from rank 0, which sent "
      "ncclSend/ncclRecv of 16 bytes \\(data type 7\\)");
}

TEST_F(CudasimNccl, BuffersOverlappingOtherThanInPlaceAreRefused) {
  // All-gather in place: this rank's part of the receive buffer is the send buffer.
  EXPECT_EQ(ncclAllGather(device_floats_, device_floats_, 16, ncclFloat32, comm_, stream_),
            ncclSuccess);
  EXPECT_EQ(ncclAllGather(device_floats_ + 1, device_floats_, 16, ncclFloat32, comm_, stream_),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("overlap other than in place"),
            std::string::npos);
  EXPECT_EQ(
      ncclAllReduce(device_floats_, device_floats_ + 4, 8, ncclFloat32, ncclSum, comm_, stream_),
      ncclInvalidArgument);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// Two messages to one peer in one group, the first larger than a ring: they arrive whole and in
// their order, whatever order the group lists the receives and sends in.
TEST_F(CudasimNccl, AGroupsMessagesToOnePeerArriveWholeAndInOrder) {
  constexpr size_t kLarge = 80000, kSmall = 2500;  // 320 KB (past the 256 KiB ring) and 10 KB
  std::vector<float> large(kLarge), small(kSmall);
  for (size_t i = 0; i < kLarge; ++i) large[i] = static_cast<float>(i);
  for (size_t i = 0; i < kSmall; ++i) small[i] = -static_cast<float>(i);
  float *send_large = nullptr, *send_small = nullptr, *recv_large = nullptr, *recv_small = nullptr;
  for (float** p : {&send_large, &recv_large})
    ASSERT_EQ(cudaMalloc(p, kLarge * sizeof(float)), cudaSuccess);
  for (float** p : {&send_small, &recv_small})
    ASSERT_EQ(cudaMalloc(p, kSmall * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send_large, large.data(), kLarge * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send_small, small.data(), kSmall * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ncclSend(send_large, kLarge, ncclFloat32, 0, comm_, stream_);
  ncclRecv(recv_large, kLarge, ncclFloat32, 0, comm_, stream_);
  ncclRecv(recv_small, kSmall, ncclFloat32, 0, comm_, stream_);
  ncclSend(send_small, kSmall, ncclFloat32, 0, comm_, stream_);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  std::vector<float> got_large(kLarge), got_small(kSmall);
  ASSERT_EQ(
      cudaMemcpy(got_large.data(), recv_large, kLarge * sizeof(float), cudaMemcpyDeviceToHost),
      cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(got_small.data(), recv_small, kSmall * sizeof(float), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(got_large, large);
  EXPECT_EQ(got_small, small);
  for (float* p : {send_large, send_small, recv_large, recv_small}) cudaFree(p);
}

TEST_F(CudasimNccl, AnOperandInHostMemoryIsTheDevicesIllegalAddress) {
  std::vector<float> host(16, 1.0f);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 16, ncclFloat32, ncclSum, comm_, stream_),
            ncclSuccess);  // issued; the device finds out when it runs
  const cudaError_t status = cudaStreamSynchronize(stream_);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, cudaErrorIllegalAddress);
  EXPECT_NE(printed.find("ncclAllReduce on communicator cudasim-nccl-single-"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("64 bytes at"), std::string::npos) << printed;
  EXPECT_NE(printed.find("are not in the device's memory"), std::string::npos) << printed;
}

TEST_F(CudasimNccl, ACollectiveInsideAGroupIsRefused) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(device_floats_, device_floats_, 4, ncclFloat32, ncclSum, comm_, stream_),
            ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("inside ncclGroupStart/End"),
            std::string::npos);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
}

TEST_F(CudasimNccl, AReductionItDoesNotEmulateIsRefused) {
  EXPECT_EQ(ncclAllReduce(device_floats_, device_floats_, 4, ncclBfloat16, ncclSum, comm_, stream_),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(device_floats_, device_floats_, 4, ncclFloat32, ncclAvg, comm_, stream_),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(device_floats_, device_floats_, 4, ncclFloat32, ncclProd, comm_, stream_),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("a reduction cudasim does not emulate"),
            std::string::npos);
  EXPECT_EQ(ncclBroadcast(device_floats_, device_floats_, 4, static_cast<ncclDataType_t>(42), 0,
                          comm_, stream_),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("not a data type"), std::string::npos);
}

TEST_F(CudasimNccl, AWindowTakesSymmetricMemoryOnly) {
  ncclWindow_t window = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(comm_, device_floats_, 64 * sizeof(float), &window,
                                   NCCL_WIN_COLL_SYMMETRIC),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("not one ncclMemAlloc allocated"),
            std::string::npos);

  // ncclMemAlloc's memory is the device's, fresh (all ones: NaN) until written.
  void* symmetric = nullptr;
  ASSERT_EQ(ncclMemAlloc(&symmetric, 4096), ncclSuccess);
  EXPECT_TRUE(cudasim::inside_device_allocation(symmetric, 4096));
  float first = 0.0f;
  ASSERT_EQ(cudaMemcpy(&first, symmetric, sizeof first, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::isnan(first));
  EXPECT_EQ(ncclCommWindowRegister(comm_, symmetric, 8192, &window, NCCL_WIN_COLL_SYMMETRIC),
            ncclInvalidArgument);  // larger than the allocation
  ASSERT_EQ(ncclCommWindowRegister(comm_, symmetric, 4096, &window, NCCL_WIN_COLL_SYMMETRIC),
            ncclSuccess);
  EXPECT_TRUE(cudasim::inside_device_allocation(window, 1));  // the handle is device memory
  EXPECT_EQ(ncclCommWindowDeregister(comm_, window), ncclSuccess);
  EXPECT_EQ(ncclMemFree(symmetric), ncclSuccess);
  EXPECT_FALSE(cudasim::inside_device_allocation(symmetric, 1));
  EXPECT_EQ(ncclMemFree(symmetric), ncclInvalidArgument);
}

}  // namespace
}  // namespace cudasim_checks
