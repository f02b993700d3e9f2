// cudasim's cuBLASLt block-scaled FP8 GEMM (cublas_sim.cpp), which only an emulated Blackwell has
// (CUDASIM_ARCH=sm_100, ctest CudaSim.Blackwell), and the CUDA backend's path onto it
// (src/kernels/cuda/mx_gemm_block_scaled.cpp, never run on a GPU: the project has no Blackwell).
// The emulation reads the scales where the cuBLAS documentation puts them; the backend writes them
// there with its own swizzle kernel (mx_scale_swizzle.cu); the reference backend multiplies the
// row-major codes and scales. Agreement, bit for bit (the emulation sums in the reference's
// order), means the backend's layout, descriptors and operand order are what cuBLAS documents.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/mx_types.h"
#include "device_vector.h"
#include "kernels/cuda/mx_gemm_block_scaled.h"
#include "kernels/cuda/runtime.h"
#include "kernels/reference/mx_gemm.h"
#include "sim_state.h"

namespace cudasim_checks {
namespace {

namespace mx = moecore::mx;
namespace cuda = moecore::kernels::cuda;
using moecore::cuda_test::DeviceVector;

// The layout's own examples, from NVIDIA's nvmath-python (get_block_scale_offset, for a 128 x 128
// NVFP4 operand: 8 blocks of 16 along k; the layout counts blocks, whatever their width): the
// scale of row 5, block 2 is byte 82, and of row 5, block 5 byte 593 (the second tile along k).
TEST(CudasimBlockScaled, ScalesLieWhereTheCublasDocumentationPutsThem) {
  EXPECT_EQ(cudasim::block_scale_offset(5, 2, 8), 82);
  EXPECT_EQ(cudasim::block_scale_offset(5, 5, 8), 593);
  // Rows 32 apart share a 16-byte line, 4 bytes apart; the next 128 rows start after every tile
  // along k of the first 128 (here two).
  EXPECT_EQ(cudasim::block_scale_offset(37, 2, 8), 82 + 4);
  EXPECT_EQ(cudasim::block_scale_offset(128, 0, 8), 2 * 512);
  // Rows padded to 128, blocks to 4.
  EXPECT_EQ(cudasim::block_scale_bytes(128, 8), 128 * 8);
  EXPECT_EQ(cudasim::block_scale_bytes(129, 5), 256 * 8);
}

// An operand [rows, k] quantised along k, on the host and on the device.
struct Operand {
  Operand(mx::ElemType type, int64_t rows, int64_t k, uint32_t seed)
      : elem(type),
        on_host(quantised(type, rows, k, seed)),
        device_codes(on_host.codes),
        device_scales(on_host.scales) {}
  mx::MxOperand host() const { return {elem, on_host.codes.data(), on_host.scales.data()}; }
  mx::MxOperand device() const { return {elem, device_codes.data(), device_scales.data()}; }

  struct Quantised {
    std::vector<uint8_t> codes, scales;
  };
  // Blocks of different magnitudes, so that the scales matter.
  static Quantised quantised(mx::ElemType type, int64_t rows, int64_t k, uint32_t seed) {
    std::mt19937 gen(seed);
    std::vector<float> x(static_cast<size_t>(rows * k));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen),
                        static_cast<int>(i / mx::kMxBlock % 7) - 3);
    Quantised q{std::vector<uint8_t>(x.size()), std::vector<uint8_t>(x.size() / mx::kMxBlock)};
    mx::quantize(type, mx::ScaleMode::kRceil, rows, k, x.data(), k, q.codes.data(),
                 q.scales.data());
    return q;
  }

  mx::ElemType elem;
  Quantised on_host;
  DeviceVector<uint8_t> device_codes, device_scales;
};

// c = a b^T through the backend's block-scaled path: taken on Blackwell only, and there equal to
// the reference bit for bit; on Hopper it issues nothing and says so (the bf16 path then runs).
// Rows past one 128-row tile and blocks past one 4-block tile, so the padding is laid out too.
TEST(CudasimBlockScaled, TheBackendsGemmRunsOnBlackwellAndEqualsTheReference) {
  cuda::activate();
  const int64_t m = 130, n = 8, k = 6 * mx::kMxBlock;
  for (const auto& [a_type, b_type] : {std::pair{mx::ElemType::kE4M3, mx::ElemType::kE4M3},
                                       std::pair{mx::ElemType::kE5M2, mx::ElemType::kE4M3}}) {
    const Operand a(a_type, m, k, 11), b(b_type, n, k, 12);
    // NaN where the GEMM writes: beta = 0 must not read it.
    const DeviceVector<float> c(
        std::vector<float>(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN()));
    const int64_t before = cudasim::block_scaled_gemms_run();
    const bool ran = cuda::mx_gemm_block_scaled("mx_matmul", a.device(), b.device(), m, n, k, 1.0f,
                                                0.0f, c.data());
    cuda::synchronize();
    if (cudasim::compute_capability_major() < 10) {
      EXPECT_FALSE(ran) << "a Hopper GPU has no block-scaled kernel";
      EXPECT_EQ(cudasim::block_scaled_gemms_run(), before);
      continue;
    }
    ASSERT_TRUE(ran);
    EXPECT_EQ(cudasim::block_scaled_gemms_run(), before + 1);
    const std::vector<float> got = c.to_host();
    std::vector<float> want(got.size());
    moecore::kernels::reference::mx_gemm(m, n, k, a.host(), b.host(), want.data(), n);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
          << "c[" << i / n << ", " << i % n << "] " << got[i] << " vs " << want[i];
  }
}

}  // namespace
}  // namespace cudasim_checks
