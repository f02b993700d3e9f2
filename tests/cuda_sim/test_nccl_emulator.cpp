// cudasim's NCCL (nccl_sim.cpp), its own checks shown to fire on a communicator of one rank:
// messages carry their operation and size, and a receive that meets another ends the process
// naming both (NCCL would hang or corrupt); an operand outside the device's memory is the
// device's illegal address; what the emulation does not do is refused in one line, not run
// wrongly. Its results across ranks are shown by the *ranks2* tests (ctest CudaSim.TwoRanks).
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
      "cudasim: NCCL: rank 0 of communicator cudasim-nccl-single-.* expected ncclSend/ncclRecv's "
      "32 bytes from rank 0, which sent ncclSend/ncclRecv's 16: the ranks issued different "
      "operations");
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
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("a reduction cudasim does not emulate"),
            std::string::npos);
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
