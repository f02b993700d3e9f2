// A whole training step captured once and replayed for every later step (issue 15 item 3), on the
// guarded device (guarded_device.h), whose Capture emulates a CUDA graph's: inside it nothing
// runs, every operation is recorded with the arguments the host gave it, a copy between host and
// device memory or an allocation is an error, and a replay runs the same operations on the same
// buffers with those arguments. A step that replays so gives the eager step's bits only when
// everything that changes from step to step reaches its kernels through device memory the host
// writes before the replay (the batch, its counted targets, the optimizer's schedule), and when
// the step needs neither a copy nor an allocation: what a CUDA graph of the step needs, shown
// without a GPU. The step is the trainer's (captured_step_runner.h), in fp32 and bf16, with the
// whole LM head or its chunks, with activations kept or recomputed.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "captured_step_runner.h"
#include "core/check.h"
#include "dist/mpi/mpi_runtime.h"
#include "guarded_device.h"

namespace moecore::captured_step {
namespace {

TEST(CapturedStep, OneCaptureReplaysEveryLaterStepWithTheEagerStepsBits) {
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  size_t operations = 0;
  const CaptureStep capture = [&](const std::function<void()>& issue) {
    guarded_device::Capture open;
    issue();
    auto graph = std::make_shared<guarded_device::Graph>(open.end());
    operations = graph->operations();
    return std::function<void()>([graph] { graph->replay(); });
  };
  const StepVariant variants[] = {
      {captured_config(), TrainPrecision::kFp32, 0, ActivationRecompute::kNone},
      {captured_config(), TrainPrecision::kBf16, 0, ActivationRecompute::kNone},
      {captured_config(), TrainPrecision::kFp32, 5, ActivationRecompute::kNone},  // 5 of 16 tokens
      {captured_config(), TrainPrecision::kBf16, 0, ActivationRecompute::kFull},
  };
  for (const StepVariant& variant : variants) {
    SCOPED_TRACE(std::string(train_precision_name(variant.precision)) + ", head chunk " +
                 std::to_string(variant.lm_head_chunk_tokens) + ", recompute " +
                 recompute_name(variant.recompute));
    const guarded_device::Scope device;
    const Trajectory eager = run_steps(mesh, variant, StepMode::kEager);
    const Trajectory replayed = run_steps(mesh, variant, StepMode::kCaptureOnce, capture);
    EXPECT_GT(operations, 100u);  // the whole step: passes, decision, updates
    expect_same_trajectory(replayed, eager);
  }
}

// The capture holds what a CUDA graph's would: a pass that copies its count of targets in from the
// host (no divisor_on_device) fails it in one line, as the CUDA backend refuses such a copy.
TEST(CapturedStep, ACopyFromTheHostInsideTheCaptureIsAnError) {
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  const guarded_device::Scope device;
  StepRunner runner(mesh, {});
  runner.stage(0);
  runner.issue(false);  // warm: the pass's copy of the count allocated
  runner.finish();
  runner.stage(1);
  guarded_device::Capture capture;
  try {
    runner.issue(false);
    FAIL() << "the capture took a copy from the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a copy of 8 bytes from the host inside a capture"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moecore::captured_step
