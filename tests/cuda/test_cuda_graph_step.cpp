// Issue 15 item 3 on the GPU, the part that needs no host read: the end of a training step as the
// trainer issues it after the passes (the gradients' sums of squares, kernels::step_decision,
// AdamW reading its factors, the selection-bias update) holds no synchronisation, so CUDA graph
// capture (global mode: a wait or a synchronous copy inside it is an error) records it whole, and
// replaying the graph gives the bits of running the same operations eagerly. An applied and a
// skipped decision are both shown. The experts' grouped GEMMs capture too: in bf16 and MXFP8 they
// read the routing's offsets on the device there (grouped_gemm_device.h), and in fp32, whose
// per-expert cuBLASLt GEMMs need them on the host, they refuse in one line instead of breaking the
// capture. And a whole training step (tests/cpp/captured_step_runner.h: the trainer's passes,
// decision and updates) captured once replays every later step with the bits of a step captured
// afresh with its own arguments.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "captured_step_runner.h"
#include "core/check.h"
#include "core/device_graph.h"
#include "core/device_memory.h"
#include "core/mx_types.h"
#include "dist/mpi/mpi_runtime.h"
#include "kernel_harness.h"
#include "kernels/cuda/cuda_graphs.h"
#include "kernels/cuda/device_selection.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops.h"

namespace moecore::cuda_test {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

template <typename T>
DeviceArray<T> on_gpu(const std::vector<T>& host) {
  return device_copy(host, Device::kCuda);
}

// What the backend's stream is given while `issue` runs, captured into a CUDA graph by the
// backend's DeviceGraphs (kernels/cuda/cuda_graphs.h, what train.cuda_graph uses); returns what
// replays it (launch, then wait). A failure inside `issue` abandons the capture.
std::function<void()> cuda_graph_of(const std::function<void()>& issue) {
  DeviceGraphs& graphs = kernels::cuda::cuda_graphs();
  graphs.begin_capture();
  try {
    issue();
  } catch (...) {
    graphs.abandon_capture();
    throw;
  }
  const std::shared_ptr<DeviceGraph> graph = graphs.end_capture();
  return [graph] {
    graph->replay();
    kernels::cuda::synchronize();
  };
}

// Captures what `issue` queues on the backend's stream into a CUDA graph (cuda_graph_of: global
// mode, where a wait for the stream or a synchronous copy fails the capture; a failure inside
// abandons it, so no later test finds the stream still capturing), replays the graph once and
// waits for it; `what` names the work in a failure.
void capture_and_replay(const std::function<void()>& issue, const char* what) {
  std::function<void()> replay;
  try {
    replay = cuda_graph_of(issue);
  } catch (const Error& e) {
    FAIL() << what << " could not be captured: " << e.what();
  }
  replay();
}

// The step's tail on device arrays, as decide_and_update (train/trainer.cpp) issues it.
struct StepTail {
  static constexpr int64_t kN = 4099, kExperts = 8;
  DeviceArray<float> params, grads, exp_avg, exp_avg_sq, bias;
  DeviceArray<double> loss_rows, tally, squares, decision;
  DeviceArray<float> factors;

  StepTail(double norm_limit) : norm_limit_(norm_limit) {
    params = on_gpu(random_values(kN, 1, 1.0f));
    grads = on_gpu(random_values(kN, 2, 0.1f));
    exp_avg = on_gpu(std::vector<float>(kN, 0.0f));
    exp_avg_sq = on_gpu(std::vector<float>(kN, 0.0f));
    bias = on_gpu(std::vector<float>(kExperts, 0.0f));
    loss_rows = on_gpu(std::vector<double>{2.5, 1.1, 9.0, 31.0, 2.4, 1.2, 8.5, 30.5});
    tally = on_gpu(std::vector<double>{3, 1, 2, 2, 5, 0, 2, 1});
    squares = on_gpu(std::vector<double>(2, 0.0));
    decision = on_gpu(std::vector<double>(3, 0.0));
    factors = on_gpu(std::vector<float>(2, 0.0f));
  }

  void issue() {
    kernels::sum_of_squares(view(grads.data(), {kN / 2}), view(squares.data(), {1}));
    kernels::sum_of_squares(view(grads.data() + kN / 2, {kN - kN / 2}),
                            view(squares.data() + 1, {1}));
    const StepDecisionOptions options{.max_grad_norm = 1.0,
                                      .loss_limit = 10.0,
                                      .norm_limit = norm_limit_,
                                      .lb_coef = 0.01,
                                      .z_coef = 0.001,
                                      .lm_z_coef = 1e-4,
                                      .loss_scale = 0.5};
    kernels::step_decision(view(loss_rows.data(), {2, kernels::kLossParts}),
                           view(squares.data(), {2}), options, ConstTensorView(),
                           view(decision.data(), {3}), view(factors.data(), {2}));
    const AdamWCoefficients c{1.0f - 1e-4f, 0.9f, 0.95f, 0.3f, 1e-8f, 2e-3f, 1.0f};
    kernels::adamw_update(view(params.data(), {kN}), view(grads.data(), {kN}),
                          view(exp_avg.data(), {kN}), view(exp_avg_sq.data(), {kN}), c,
                          ConstTensorView(), view(factors.data(), {2}));
    kernels::router_bias_update(view(tally.data(), {kExperts}), 1e-3f, view(factors.data(), {2}),
                                view(bias.data(), {kExperts}));
  }

  std::vector<float> host_params() const { return host_copy(params); }
  std::vector<float> host_bias() const { return host_copy(bias); }
  std::vector<double> host_decision() const { return host_copy(decision); }

 private:
  double norm_limit_;
};

void expect_graph_replays_the_eager_step(double norm_limit, bool applies) {
  kernels::cuda::activate();
  StepTail eager(norm_limit), captured(norm_limit);
  eager.issue();
  kernels::cuda::synchronize();

  ASSERT_NO_FATAL_FAILURE(capture_and_replay([&] { captured.issue(); }, "the step's tail"));

  EXPECT_EQ(captured.host_decision(), eager.host_decision());
  EXPECT_EQ(eager.host_decision()[2], applies ? 1.0 : 0.0);
  EXPECT_EQ(captured.host_params(), eager.host_params());
  EXPECT_EQ(captured.host_bias(), eager.host_bias());
  const std::vector<float> before = random_values(StepTail::kN, 1, 1.0f);
  EXPECT_EQ(eager.host_params() == before, !applies);
}

// The experts' GEMMs of one MoE layer on a static-capacity buffer (rows past the offsets, as the
// padded dispatch leaves them), issued on device arrays.
struct ExpertGemms {
  static constexpr int64_t kExperts = 4, kOut = 96, kIn = 80, kCapacity = 300;
  const std::vector<int64_t> offsets_host = {0, 70, 70, 71, 250};
  DeviceArray<float> x, w, dy, y, dx, dw;
  DeviceArray<int64_t> offsets;

  ExpertGemms() {
    x = on_gpu(random_values(kCapacity * kIn, 11, 1.0f));
    w = on_gpu(random_values(kExperts * kOut * kIn, 12, 0.1f));
    dy = on_gpu(random_values(kCapacity * kOut, 13, 1.0f));
    y = on_gpu(std::vector<float>(kCapacity * kOut, 7.0f));  // 7: untouched
    dx = on_gpu(std::vector<float>(kCapacity * kIn, 5.0f));  // 5: untouched
    dw = on_gpu(random_values(kExperts * kOut * kIn, 14, 0.01f));
    offsets = on_gpu(offsets_host);
  }

  void issue(kernels::MatmulPrecision precision) {
    const ConstTensorView ws(w.data(), {kExperts, kOut, kIn}, DType::kF32);
    const ConstTensorView offs = view(offsets.data(), {kExperts + 1});
    kernels::grouped_gemm_forward(view(x.data(), {kCapacity, kIn}), ws, offs,
                                  view(y.data(), {kCapacity, kOut}), precision);
    kernels::grouped_gemm_backward(
        view(dy.data(), {kCapacity, kOut}), view(x.data(), {kCapacity, kIn}), ws, offs,
        view(dx.data(), {kCapacity, kIn}),
        TensorView(dw.data(), {kExperts, kOut, kIn}, DType::kF32), precision);
  }
};

// Both sum exact bf16 products in fp32, in different orders: kernel_harness.h's bound for sums of
// the contraction's terms (in, out, and an expert's rows for dw: at most 180).
TEST(CudaGraphStep, TheExpertsGemmsCaptureInBf16ReadingTheirOffsetsOnTheDevice) {
  kernels::cuda::activate();
  ExpertGemms eager, captured;
  eager.issue(kernels::MatmulPrecision::kBf16);  // per-expert cuBLASLt GEMMs (a host read)
  kernels::cuda::synchronize();

  ASSERT_NO_FATAL_FAILURE(capture_and_replay(
      [&] { captured.issue(kernels::MatmulPrecision::kBf16); }, "the grouped GEMMs"));

  const int64_t used = captured.offsets_host.back();
  const std::vector<float> y = host_copy(captured.y), y_ref = host_copy(eager.y);
  const std::vector<float> dx = host_copy(captured.dx), dx_ref = host_copy(eager.dx);
  auto rows = [](const std::vector<float>& v, int64_t count, int64_t width) {
    return std::vector<float>(v.begin(), v.begin() + count * width);
  };
  using G = ExpertGemms;
  EXPECT_LE(kernel_harness::nmse(rows(y, used, G::kOut), rows(y_ref, used, G::kOut)),
            kernel_harness::nmse_bound(G::kIn));
  EXPECT_LE(kernel_harness::nmse(rows(dx, used, G::kIn), rows(dx_ref, used, G::kIn)),
            kernel_harness::nmse_bound(G::kOut));
  EXPECT_LE(kernel_harness::nmse(host_copy(captured.dw), host_copy(eager.dw)),
            kernel_harness::nmse_bound(180));
  for (size_t i = static_cast<size_t>(used * G::kOut); i < y.size(); ++i)
    ASSERT_EQ(y[i], 7.0f) << "y's row " << i / G::kOut << " past the offsets";
  for (size_t i = static_cast<size_t>(used * G::kIn); i < dx.size(); ++i)
    ASSERT_EQ(dx[i], 5.0f) << "dx's row " << i / G::kIn << " past the offsets";
}

// The MXFP8 experts' forward GEMM: in a capture, both MX operands are dequantised to bf16 and one
// device-offset launch multiplies them; eagerly, per-expert GEMMs on the host's offsets (on
// Hopper also through bf16; block-scaled on Blackwell). The products of two dequantised codes are
// exact in fp32 on both sides, summed in different orders: nmse_bound(k).
TEST(CudaGraphStep, TheMxExpertsGemmCapturesReadingItsOffsetsOnTheDevice) {
  kernels::cuda::activate();
  constexpr int64_t kExperts = 4, kOut = 96, kIn = 64, kRows = 300;
  const std::vector<int64_t> offsets_host = {0, 70, 70, 71, 250};
  const int64_t used = offsets_host.back();
  const DeviceArray<float> x = on_gpu(random_values(kRows * kIn, 21, 1.0f));
  const DeviceArray<float> w = on_gpu(random_values(kExperts * kOut * kIn, 22, 0.1f));
  const DeviceArray<int64_t> offsets = on_gpu(offsets_host);
  DeviceArray<uint8_t> x_codes(Device::kCuda, kRows * kIn),
      x_scales(Device::kCuda, kRows * kIn / 32);
  DeviceArray<uint8_t> w_codes(Device::kCuda, kExperts * kOut * kIn),
      w_scales(Device::kCuda, kExperts * kOut * kIn / 32);
  kernels::mx_quantize(view(x.data(), {kRows, kIn}), mx::ScaleMode::kRceil,
                       TensorView(x_codes.data(), {kRows, kIn}, DType::kE4m3),
                       TensorView(x_scales.data(), {kRows, kIn / 32}, DType::kE8m0));
  kernels::mx_quantize(ConstTensorView(w.data(), {kExperts, kOut, kIn}, DType::kF32),
                       mx::ScaleMode::kRceil,
                       TensorView(w_codes.data(), {kExperts, kOut, kIn}, DType::kE4m3),
                       TensorView(w_scales.data(), {kExperts, kOut, kIn / 32}, DType::kE8m0));
  const MxOperandView xo{ConstTensorView(x_codes.data(), {kRows, kIn}, DType::kE4m3),
                         ConstTensorView(x_scales.data(), {kRows, kIn / 32}, DType::kE8m0)};
  const MxOperandView wo{
      ConstTensorView(w_codes.data(), {kExperts, kOut, kIn}, DType::kE4m3),
      ConstTensorView(w_scales.data(), {kExperts, kOut, kIn / 32}, DType::kE8m0)};
  DeviceArray<float> eager = on_gpu(std::vector<float>(kRows * kOut, 7.0f));
  DeviceArray<float> captured = on_gpu(std::vector<float>(kRows * kOut, 7.0f));
  const ConstTensorView offs = view(offsets.data(), {kExperts + 1});
  kernels::mx_grouped_gemm_forward(xo, wo, offs, view(eager.data(), {kRows, kOut}));
  kernels::cuda::synchronize();

  ASSERT_NO_FATAL_FAILURE(capture_and_replay(
      [&] {
        kernels::mx_grouped_gemm_forward(xo, wo, offs, view(captured.data(), {kRows, kOut}));
      },
      "the MX grouped GEMM"));

  const std::vector<float> got = host_copy(captured), want = host_copy(eager);
  EXPECT_LE(kernel_harness::nmse(std::vector<float>(got.begin(), got.begin() + used * kOut),
                                 std::vector<float>(want.begin(), want.begin() + used * kOut)),
            kernel_harness::nmse_bound(kIn));
  for (size_t i = static_cast<size_t>(used * kOut); i < got.size(); ++i)
    ASSERT_EQ(got[i], 7.0f) << "row " << i / kOut << " past the offsets";
}

TEST(CudaGraphStep, TheExpertsGemmsRefuseACaptureInFp32InOneLine) {
  kernels::cuda::activate();
  ExpertGemms gemms;
  ASSERT_EQ(cudaStreamBeginCapture(kernels::cuda::stream(), cudaStreamCaptureModeGlobal),
            cudaSuccess);
  std::string message;
  try {
    gemms.issue(kernels::MatmulPrecision::kFp32);
  } catch (const Error& e) {
    message = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(kernels::cuda::stream(), &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_NE(message.find("[grouped_gemm] reads the experts' offsets on the host, which a stream "
                         "being captured into a CUDA graph cannot do"),
            std::string::npos)
      << message;
}

TEST(CudaGraphStep, TheAppliedStepsTailCapturesAndReplaysBitForBit) {
  expect_graph_replays_the_eager_step(1e9, true);
}

TEST(CudaGraphStep, TheSkippedStepsTailCapturesAndChangesNothing) {
  expect_graph_replays_the_eager_step(0.0, false);
}

// A model the CUDA kernels take as they take the default run's (head_dim 16, widths of 16s).
ModelConfig gpu_step_config() {
  ModelConfig c = captured_step::captured_config();
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.num_experts = 8;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 64;
  c.shared_expert_intermediate_size = 32;
  return c;
}

// Issue 15 item 3: a whole training step in bf16, captured into a CUDA graph at step 1 and replayed
// for steps 1-5 with only its inputs re-staged (batch, counts, AdamW's coefficients), gives every
// step's decision and weights bit for bit as a graph captured afresh at each step with that step's
// arguments. (The eager step runs other expert GEMMs, per-expert cuBLASLt on the host's offsets,
// so it is not the reference here; tests/cpp/test_captured_step.cpp shows the same property
// against the eager step on the guarded device.)
TEST(CudaGraphStep, AWholeTrainingStepCapturedOnceReplaysEveryLaterStepInBf16) {
  kernels::cuda::activate();
  const DefaultDeviceScope on_gpu(Device::kCuda);
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  using captured_step::StepMode;
  using Variant = std::pair<int64_t, ActivationRecompute>;  // the head's chunk, the recompute
  for (const auto& [chunk, recompute] :
       {Variant{0, ActivationRecompute::kNone}, Variant{5, ActivationRecompute::kNone},
        Variant{0, ActivationRecompute::kFull}}) {
    SCOPED_TRACE("head chunk " + std::to_string(chunk) + ", recompute " +
                 recompute_name(recompute));
    const captured_step::StepVariant variant{gpu_step_config(), TrainPrecision::kBf16, chunk,
                                             recompute};
    const captured_step::Trajectory each =
        captured_step::run_steps(mesh, variant, StepMode::kCaptureEach, cuda_graph_of);
    const captured_step::Trajectory once =
        captured_step::run_steps(mesh, variant, StepMode::kCaptureOnce, cuda_graph_of);
    captured_step::expect_same_trajectory(once, each);
  }
}

// In fp32 the experts' per-expert cuBLASLt GEMMs need the offsets on the host: the whole step's
// capture fails in one line naming them, and the stream goes on working.
TEST(CudaGraphStep, AWholeTrainingStepInFp32RefusesTheCaptureInOneLine) {
  kernels::cuda::activate();
  const DefaultDeviceScope on_gpu(Device::kCuda);
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  const captured_step::StepVariant variant{gpu_step_config(), TrainPrecision::kFp32, 0,
                                           ActivationRecompute::kNone};
  try {
    captured_step::run_steps(mesh, variant, captured_step::StepMode::kCaptureOnce, cuda_graph_of);
    FAIL() << "an fp32 step was captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads the experts' offsets on the host"),
              std::string::npos)
        << e.what();
  }
  const captured_step::Trajectory eager =
      captured_step::run_steps(mesh, variant, captured_step::StepMode::kEager);
  EXPECT_EQ(eager.decisions.back()[2], 1.0);
}

}  // namespace
}  // namespace moecore::cuda_test
