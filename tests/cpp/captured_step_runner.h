// The trainer's step (train/trainer.cpp) on one process, split as a CUDA graph needs it: what the
// host does before the step (stage: the batch into static device buffers, the optimizer's
// coefficients), the step's work (issue: two micro-batches' passes, the step's decision where the
// gradients are, the AdamW update, the selection-bias update; it reads nothing back) and what the
// host reads after it (finish). Shared by the guarded device's emulated capture
// (tests/cpp/test_captured_step.cpp) and the CUDA graph's (tests/cuda/test_cuda_graph_step.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/ignore_index.h"
#include "core/splitmix64.h"
#include "core/tensor_view.h"
#include "dist/distributed_optimizer.h"
#include "dist/mesh.h"
#include "kernels/ops.h"
#include "model/activation_recompute.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "optim/optim_config.h"
#include "tiny_moe_config.h"

namespace moecore::captured_step {

constexpr int64_t kBatch = 2, kSeq = 8, kMicroBatches = 2, kSteps = 6;
constexpr int64_t kTokens = kBatch * kSeq;
// The LM head's z-loss is on in every captured step: its term in the loss rows and the decision.
constexpr double kZLossMultiplier = 1e-3;

// Step `step`'s micro-batches: random ids, and a number of ignored targets (-100) that changes
// from step to step, so that the cross-entropy's divisor does too.
struct StepBatch {
  std::array<std::vector<int32_t>, kMicroBatches> tokens, targets;
  std::array<double, kMicroBatches> counted{};
};
inline StepBatch step_batch(int64_t step, int64_t vocab) {
  StepBatch b;
  SplitMix64 random(1000 + static_cast<uint64_t>(step));
  for (int64_t micro = 0; micro < kMicroBatches; ++micro) {
    auto& tokens = b.tokens[static_cast<size_t>(micro)];
    auto& targets = b.targets[static_cast<size_t>(micro)];
    for (int64_t i = 0; i < kTokens; ++i) {
      tokens.push_back(static_cast<int32_t>(random.bounded(static_cast<uint64_t>(vocab))));
      targets.push_back(static_cast<int32_t>(random.bounded(static_cast<uint64_t>(vocab))));
    }
    const int64_t ignored = (step + micro) % 5;
    std::fill(targets.begin(), targets.begin() + ignored, kIgnoreIndex);
    b.counted[static_cast<size_t>(micro)] = static_cast<double>(kTokens - ignored);
  }
  return b;
}

// The tiny MoE model with the selection-bias update, which is then part of the step.
inline ModelConfig captured_config() {
  ModelConfig c = tiny_moe_config(2);
  c.router_bias_update_rate = 0.01;
  return c;
}

inline OptimConfig captured_optim() {
  OptimConfig oc;
  oc.lr = 3e-2;
  oc.warmup_steps = 4;  // a learning rate that changes at every step
  oc.max_grad_norm = 1.0;
  oc.weight_decay = 0.1;
  return oc;
}

// How a step runs: the model, the recipe, the LM head's chunk (0: the whole head) and the
// recompute mode.
struct StepVariant {
  ModelConfig config = captured_config();
  TrainPrecision precision = TrainPrecision::kFp32;
  int64_t lm_head_chunk_tokens = 0;
  ActivationRecompute recompute = ActivationRecompute::kNone;
};

// A model, its optimizer and the step's buffers in the default device's memory, the batch in
// static device buffers that every step's inputs are copied into.
class StepRunner {
 public:
  StepRunner(const dist::Mesh& mesh, const StepVariant& variant)
      : config_(variant.config),
        layout_(ParamLayout::build(config_)),
        params_(layout_),
        grads_(layout_),
        model_(config_, layout_),
        optimizer_(layout_, optim_, mesh, false) {
    ParamBuffers host(layout_, Device::kCpu);
    fill_tiny_params(layout_, 11, host);
    copy_bytes(params_.dense.data(), host.dense.data(), host.dense.size() * sizeof(float));
    copy_bytes(params_.expert.data(), host.expert.data(), host.expert.size() * sizeof(float));
    model_.set_precision(PrecisionRecipe::from_train(variant.precision, {}));
    model_.set_lm_head_chunk_tokens(variant.lm_head_chunk_tokens);
    model_.set_z_loss_multiplier(kZLossMultiplier);
    model_.set_recompute(variant.recompute);
    for (int64_t micro = 0; micro < kMicroBatches; ++micro) {
      tokens_[static_cast<size_t>(micro)].resize(kTokens);
      targets_[static_cast<size_t>(micro)].resize(kTokens);
    }
    counted_.resize(kMicroBatches);
    decision_.resize(3);
    factors_.resize(2);
  }

  // The host's part before step `step`'s work: its batch into the static buffers, its
  // coefficients staged.
  void stage(int64_t step) {
    const StepBatch b = step_batch(step, config_.vocab_size);
    for (size_t micro = 0; micro < kMicroBatches; ++micro) {
      copy_bytes(tokens_[micro].data(), b.tokens[micro].data(), kTokens * sizeof(int32_t));
      copy_bytes(targets_[micro].data(), b.targets[micro].data(), kTokens * sizeof(int32_t));
    }
    copy_bytes(counted_.data(), b.counted.data(), sizeof(b.counted));
    host_counted_ = b.counted;
    optimizer_.stage_step(std::vector<double>{learning_rate(optim_, step, kSteps)});
  }

  // The step's work, as the trainer issues it: nothing here reads device memory back. Without
  // divisor_on_device each pass copies its count in from the host.
  void issue(bool divisor_on_device = true) {
    grads_.zero();
    constexpr float kLossScale = 1.0f / kMicroBatches;
    for (int64_t micro = 0; micro < kMicroBatches; ++micro) {
      model_.set_next_batch_counts(
          {static_cast<int64_t>(host_counted_[static_cast<size_t>(micro)]), kTokens,
           divisor_on_device ? view(counted_.data() + micro, {1}) : ConstTensorView()});
      model_.forward_chunk(0, params_, tokens_[static_cast<size_t>(micro)].data(), nullptr,
                           targets_[static_cast<size_t>(micro)].data(), kBatch, kSeq, nullptr);
      model_.backward(params_, grads_, kLossScale);
    }
    const ConstTensorView squares = optimizer_.reduce_gradients(grads_, model_.workspace());
    const StepDecisionOptions decide{.max_grad_norm = optim_.max_grad_norm,
                                     .loss_limit = 1e9,
                                     .norm_limit = 1e9,
                                     .lb_coef = config_.router_aux_loss_coef,
                                     .z_coef = config_.router_z_loss_coef,
                                     .lm_z_coef = kZLossMultiplier,
                                     .loss_scale = kLossScale};
    kernels::step_decision(model_.recorded_losses(), squares, decide, ConstTensorView(),
                           view(decision_.data(), {3}), view(factors_.data(), {2}));
    optimizer_.step(params_, grads_, view(factors_.data(), {2}), model_.workspace());
    model_.update_router_bias(params_, view(factors_.data(), {2}));
    model_.weights_changed();
  }

  // The host's part after the step: its decision (loss, norm, applied), the losses' rows let go.
  std::vector<double> finish() {
    model_.read_losses();
    return host_copy(decision_);
  }

  std::vector<float> weights() const {
    std::vector<float> all = host_copy(params_.dense), expert = host_copy(params_.expert);
    all.insert(all.end(), expert.begin(), expert.end());
    return all;
  }

 private:
  const ModelConfig config_;
  const OptimConfig optim_ = captured_optim();
  const ParamLayout layout_;
  ParamBuffers params_, grads_;
  Transformer model_;
  dist::DistributedOptimizer optimizer_;
  std::array<DeviceArray<int32_t>, kMicroBatches> tokens_, targets_;
  DeviceArray<double> counted_, decision_;
  DeviceArray<float> factors_;
  std::array<double, kMicroBatches> host_counted_{};
};

// Every step's decision (loss, norm, applied) and weights.
struct Trajectory {
  std::vector<std::vector<double>> decisions;
  std::vector<std::vector<float>> weights;
};

// Captures what `issue` gives the device and returns what replays it: the guarded device's
// emulated capture, or a CUDA graph's.
using CaptureStep = std::function<std::function<void()>(const std::function<void()>& issue)>;

// How the steps run after step 0, which runs eagerly and warms every buffer: eagerly, captured
// once at step 1 and replayed from there on, or captured afresh and replayed at every step (with
// that step's arguments: the reference for a captured step where the eager one runs other kernels).
enum class StepMode { kEager, kCaptureOnce, kCaptureEach };

// Every step's decision and weights of `got` are `expected`'s bit for bit, every step applied and
// the weights moving from step to step (so that a replay that changed nothing would fail).
inline void expect_same_trajectory(const Trajectory& got, const Trajectory& expected) {
  for (int64_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const size_t s = static_cast<size_t>(step);
    EXPECT_EQ(got.decisions[s], expected.decisions[s]);
    EXPECT_EQ(got.decisions[s][2], 1.0);  // applied
    EXPECT_EQ(got.weights[s], expected.weights[s]);
    if (step > 0) {
      EXPECT_NE(expected.weights[s], expected.weights[s - 1]);
    }
  }
}

inline Trajectory run_steps(const dist::Mesh& mesh, const StepVariant& variant, StepMode mode,
                            const CaptureStep& capture = {}) {
  StepRunner runner(mesh, variant);
  std::function<void()> replay;
  Trajectory t;
  for (int64_t step = 0; step < kSteps; ++step) {
    runner.stage(step);
    if (mode == StepMode::kEager || step == 0) {
      runner.issue();
    } else {
      if (!replay || mode == StepMode::kCaptureEach) replay = capture([&] { runner.issue(); });
      replay();
    }
    t.decisions.push_back(runner.finish());
    t.weights.push_back(runner.weights());
  }
  return t;
}

}  // namespace moecore::captured_step
