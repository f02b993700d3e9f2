// core/device_memory.h on the guarded device (guarded_device.h: host pages the host cannot touch
// outside the operations): allocations know their device by address, arrays keep std::vector's
// resize rule through copies, host touches crash, and a model layer made of kernels/ops.h calls
// (the SwiGLU MLP, forward and backward) and a whole training pass of the transformer run on
// device memory with the CPU's bits; where the pass reads device memory back.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "gradcheck.h"
#include "guarded_device.h"
#include "kernels/loss_parts.h"
#include "kernels/matmul_precision.h"
#include "model/activation_recompute.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/swiglu_mlp.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"
#include "tiny_moe_pass.h"

namespace moecore {
namespace {

using gradcheck::random_vec;

// A host vector's copy in device memory, and back.
DeviceArray<float> to_device(const std::vector<float>& host) {
  DeviceArray<float> array(Device::kCuda, host.size());
  copy_bytes(array.data(), host.data(), host.size() * sizeof(float));
  return array;
}
std::vector<float> to_host(const DeviceArray<float>& array) {
  std::vector<float> host(array.size());
  copy_bytes(host.data(), array.data(), host.size() * sizeof(float));
  return host;
}

TEST(DeviceMemory, HostMemoryIsTheCpus) {
  float on_stack = 0.0f;
  EXPECT_EQ(device_of(&on_stack), Device::kCpu);
  DeviceArray<float> host(Device::kCpu, 5);
  host.data()[4] = 2.0f;  // host arrays are plain host memory
  EXPECT_EQ(device_of(host.data()), Device::kCpu);
  EXPECT_EQ(view(host.data(), {5}).device(), Device::kCpu);
  EXPECT_THROW(DeviceArray<float>(Device::kCuda, 3), Error);  // no device memory registered
}

TEST(DeviceMemory, AllocationsKnowTheirDeviceByAddress) {
  const guarded_device::Scope device;
  DeviceArray<float> a(Device::kCuda, 1000);
  EXPECT_EQ(device_of(a.data()), Device::kCuda);
  EXPECT_EQ(device_of(a.data() + 999), Device::kCuda);
  EXPECT_EQ(view(a.data() + 10, {3, 4}).device(), Device::kCuda);
  {
    DeviceArray<float> b(Device::kCuda, 10);
    EXPECT_EQ(device_of(b.data() + 9), Device::kCuda);
  }
  std::vector<float> host(4);
  EXPECT_EQ(device_of(host.data()), Device::kCpu);
}

TEST(DeviceMemory, ResizeKeepsContentsAndZeroesTheRest) {
  const guarded_device::Scope device;
  DeviceArray<float> a = to_device({1.0f, 2.0f, 3.0f});
  a.resize(5);
  EXPECT_EQ(to_host(a), (std::vector<float>{1.0f, 2.0f, 3.0f, 0.0f, 0.0f}));
  a.resize(2);
  a.resize(4);  // within the capacity kept: the regrown elements are zero again
  EXPECT_EQ(to_host(a), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.0f}));
  DeviceArray<float> b(Device::kCuda);
  b = std::move(a);
  EXPECT_EQ(to_host(b), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.0f}));
  b.zero();
  EXPECT_EQ(to_host(b), (std::vector<float>(4, 0.0f)));
}

TEST(DeviceMemoryDeathTest, TheHostTouchingDeviceMemoryCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const guarded_device::Scope device;
  DeviceArray<float> a(Device::kCuda, 16);
  volatile float* element = a.data() + 3;
  EXPECT_DEATH(*element = 1.0f, "");
  EXPECT_DEATH(static_cast<void>(*element), "");
  // The same touch through copy_bytes is fine.
  const float one = 1.0f;
  copy_bytes(a.data() + 3, &one, sizeof(float));
  EXPECT_EQ(to_host(a)[3], 1.0f);
}

// The SwiGLU MLP (model/swiglu_mlp.h), forward and backward, on device memory and on the host:
// the same operations on the same values, so the same bits, in fp32 and bf16.
TEST(DeviceMemory, SwigluMlpRunsOnDeviceMemoryWithTheCpusBits) {
  const SwigluShape s{.rows = 13, .dim = 24, .hidden = 40};
  const size_t x_n = 13 * 24, gu_n = 13 * 80, act_n = 13 * 40;
  const std::vector<float> x = random_vec(x_n, 1), dy = random_vec(x_n, 2);
  const std::vector<float> w_gu = random_vec(80 * 24, 3), w_down = random_vec(24 * 40, 4);
  for (const kernels::MatmulPrecision precision :
       {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
    // The SwiGLU output and its gradient as the model keeps them: bf16 bits in bf16.
    const DType act_type =
        precision == kernels::MatmulPrecision::kBf16 ? DType::kBf16 : DType::kF32;
    const size_t width = dtype_size(act_type);
    // On the host.
    std::vector<float> gu(gu_n), y(x_n), dx(x_n), dw_gu(w_gu.size()), dw_down(w_down.size()),
        dact(act_n);
    std::vector<std::byte> act(act_n * width), dgu(gu_n * width);
    swiglu_mlp_forward(precision, s, x.data(), view(w_gu.data(), {80, 24}),
                       view(w_down.data(), {24, 40}), gu.data(),
                       TensorView(act.data(), {13, 40}, act_type), y.data());
    swiglu_mlp_backward(precision, s, dy.data(), x.data(), view(w_gu.data(), {80, 24}),
                        view(w_down.data(), {24, 40}), gu.data(),
                        ConstTensorView(act.data(), {13, 40}, act_type), dx.data(), dw_gu.data(),
                        dw_down.data(), dact.data(), TensorView(dgu.data(), {13, 80}, act_type),
                        false);

    // On the device.
    const guarded_device::Scope device;
    const DeviceArray<float> x_d = to_device(x), dy_d = to_device(dy);
    const DeviceArray<float> w_gu_d = to_device(w_gu), w_down_d = to_device(w_down);
    DeviceArray<float> gu_d(Device::kCuda, gu_n), y_d(Device::kCuda, x_n), dx_d(Device::kCuda, x_n),
        dw_gu_d(Device::kCuda, w_gu.size()), dw_down_d(Device::kCuda, w_down.size()),
        dact_d(Device::kCuda, act_n);
    DeviceArray<std::byte> act_d(Device::kCuda, act_n * width), dgu_d(Device::kCuda, gu_n * width);
    swiglu_mlp_forward(precision, s, x_d.data(), view(w_gu_d.data(), {80, 24}),
                       view(w_down_d.data(), {24, 40}), gu_d.data(),
                       TensorView(act_d.data(), {13, 40}, act_type), y_d.data());
    swiglu_mlp_backward(precision, s, dy_d.data(), x_d.data(), view(w_gu_d.data(), {80, 24}),
                        view(w_down_d.data(), {24, 40}), gu_d.data(),
                        ConstTensorView(act_d.data(), {13, 40}, act_type), dx_d.data(),
                        dw_gu_d.data(), dw_down_d.data(), dact_d.data(),
                        TensorView(dgu_d.data(), {13, 80}, act_type), false);
    EXPECT_EQ(to_host(y_d), y);
    EXPECT_EQ(to_host(dx_d), dx);
    EXPECT_EQ(to_host(dw_gu_d), dw_gu);
    EXPECT_EQ(to_host(dw_down_d), dw_down);
  }
}

// One training pass of the transformer (forward with targets, backward) with every parameter,
// activation and temporary in device memory: the same loss parts and gradients, bit for bit, as
// on the host. The guarded device faults on any host touch of its memory, so the pass also shows
// that the step reaches its tensors only through kernels and copies.
struct StepResult {
  LossParts loss;
  std::vector<float> dense_grads, expert_grads;
};

// reads_of_pass: when given, the host reads of the forward and backward (HostReadLog), and
// reads_of_losses those of reading the losses after them.
StepResult training_pass(const ModelConfig& c, const PrecisionRecipe& recipe,
                         ActivationRecompute recompute, int32_t document_eos,
                         std::vector<HostRead>* reads_of_pass = nullptr,
                         std::vector<HostRead>* reads_of_losses = nullptr) {
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers host_params(layout, Device::kCpu);
  fill_tiny_params(layout, 5, host_params);
  ParamBuffers params(layout);  // on the default device
  copy_bytes(params.dense.data(), host_params.dense.data(), params.dense.size() * sizeof(float));
  copy_bytes(params.expert.data(), host_params.expert.data(), params.expert.size() * sizeof(float));
  ParamBuffers grads(layout);
  Transformer model(c, layout);
  model.set_precision(recipe);
  model.set_recompute(recompute);
  model.set_document_masking(document_eos);
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> tokens(kTinyTokens), targets(kTinyTargets);
  for (int32_t& t : tokens) t %= static_cast<int32_t>(c.vocab_size);
  StepResult r;
  {
    std::optional<HostReadLog> log;
    if (reads_of_pass != nullptr) log.emplace();
    model.forward_chunk(0, params, tokens.data(), nullptr, targets.data(), batch, seq, nullptr);
    model.backward(params, grads, 0.75f);
    if (reads_of_pass != nullptr) *reads_of_pass = log->reads();
  }
  {
    std::optional<HostReadLog> log;
    if (reads_of_losses != nullptr) log.emplace();
    const std::vector<LossParts> losses = model.read_losses();
    EXPECT_EQ(losses.size(), 1u);
    r.loss = losses.at(0);
    if (reads_of_losses != nullptr) *reads_of_losses = log->reads();
  }
  r.dense_grads = host_copy(grads.dense);
  r.expert_grads = host_copy(grads.expert);
  return r;
}

void expect_same_pass_on_the_device(const ModelConfig& c, const PrecisionRecipe& recipe,
                                    ActivationRecompute recompute, int32_t document_eos) {
  const StepResult on_host = training_pass(c, recipe, recompute, document_eos);
  const guarded_device::Scope device;
  const StepResult on_device = training_pass(c, recipe, recompute, document_eos);
  EXPECT_EQ(on_device.loss.total, on_host.loss.total);
  EXPECT_EQ(on_device.loss.ce, on_host.loss.ce);
  EXPECT_EQ(on_device.loss.lb, on_host.loss.lb);
  EXPECT_EQ(on_device.loss.z, on_host.loss.z);
  EXPECT_EQ(on_device.dense_grads, on_host.dense_grads);
  EXPECT_EQ(on_device.expert_grads, on_host.expert_grads);
  EXPECT_GT(on_host.loss.lb, 0.0);  // the MoE layer ran
}

TEST(DeviceMemory, TransformerPassRunsOnDeviceMemoryWithTheCpusBits) {
  const ModelConfig c = tiny_moe_config(2);
  for (const TrainPrecision precision : {TrainPrecision::kFp32, TrainPrecision::kBf16}) {
    const PrecisionRecipe recipe = PrecisionRecipe::from_train(precision, {});
    expect_same_pass_on_the_device(c, recipe, ActivationRecompute::kNone, -1);
    expect_same_pass_on_the_device(c, recipe, ActivationRecompute::kFull, -1);
    expect_same_pass_on_the_device(c, recipe, ActivationRecompute::kNone, 4);  // document masking
  }
}

// The tiny model with every GEMM dimension of the experts a multiple of 32 (MXFP8 contracts in
// blocks of 32).
ModelConfig mxfp8_config() {
  ModelConfig c = tiny_moe_config(2);
  c.hidden_size = 32;
  c.head_dim = 16;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 64;
  c.shared_expert_intermediate_size = 32;
  return c;
}

// Where a training pass on a device waits for it: every host read of device memory (a copy back,
// a value handed to the host; core/device_memory.h's HostReadLog) with the phase it fell in. A
// pass never waits: the routing's counts and the experts' row offsets stay on the device, and
// so do the losses' statistics, the losses made from them and the routers' loss gradient
// (kernels::moe_loss_terms), so on a GPU the host queues a whole forward and backward without
// stopping. Reading the losses afterwards is one copy of [ce, lb, z]. In MXFP8 the experts'
// weight gradients read the offsets once per layer (their per-expert loop runs from the host).
// Issue 15 item 3: a step captured in a CUDA graph may hold none of these at all.
bool in_a_layer(const std::string& phase) {
  for (const char* layer :
       {"attention_", "router_", "dispatch_", "experts_", "shared_expert_", "combine_"})
    if (phase.starts_with(layer)) return true;
  return false;
}

struct PassReads {
  std::vector<HostRead> pass, losses;
};
PassReads host_reads_of_a_pass(const ModelConfig& c, const PrecisionRecipe& recipe,
                               ActivationRecompute recompute) {
  const guarded_device::Scope device;
  PassReads reads;
  training_pass(c, recipe, recompute, -1, &reads.pass, &reads.losses);
  return reads;
}

int64_t moe_layer_count(const ModelConfig& c) {
  int64_t layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers += c.layer_is_dense(i) ? 0 : 1;
  return layers;
}

// Reading a pass's losses: one copy of its loss parts (kernels/loss_parts.h).
const std::string kLossesCopy =
    "copy of " + std::to_string(kernels::kLossParts * sizeof(double)) + " bytes";

TEST(DeviceMemory, APassNeverWaitsForTheDeviceAndItsLossesAreOneCopy) {
  const ModelConfig c = tiny_moe_config(2);
  ASSERT_GT(moe_layer_count(c), 0);
  for (const TrainPrecision precision : {TrainPrecision::kFp32, TrainPrecision::kBf16})
    for (const ActivationRecompute recompute :
         {ActivationRecompute::kNone, ActivationRecompute::kFull}) {
      SCOPED_TRACE(train_precision_name(precision));
      const PassReads reads =
          host_reads_of_a_pass(c, PrecisionRecipe::from_train(precision, {}), recompute);
      EXPECT_TRUE(reads.pass.empty())
          << reads.pass.front().phase << ": " << reads.pass.front().what;
      ASSERT_EQ(reads.losses.size(), 1u);
      EXPECT_EQ(reads.losses[0].phase, "none");
      EXPECT_EQ(reads.losses[0].what, kLossesCopy);
      EXPECT_EQ(reads.losses[0].count, 1);
    }
}

// What a pass copies into device memory (issue 15 item 3's other half): once warm (its buffers
// allocated, its tables made by the first pass), a training pass copies in only its token ids and
// targets (batch x seq i32 each) and its count of targets (one f64, the cross-entropy's divisor),
// and none at all when they are in device memory already (the count given there by the caller,
// BatchCounts::divisor_on_device): then it copies nothing between host and device either way
// (above: it reads nothing), which a CUDA graph's capture needs (the CUDA backend refuses a copy
// inside one in one line), and computes the same gradients bit for bit.
TEST(DeviceMemory, AWarmPassCopiesInOnlyItsInputsAndNothingWhenTheyAreOnTheDevice) {
  const ModelConfig c = tiny_moe_config(2);
  for (const TrainPrecision precision : {TrainPrecision::kFp32, TrainPrecision::kBf16}) {
    SCOPED_TRACE(train_precision_name(precision));
    const guarded_device::Scope device;
    const ParamLayout layout = ParamLayout::build(c);
    ParamBuffers host_params(layout, Device::kCpu);
    fill_tiny_params(layout, 5, host_params);
    ParamBuffers params(layout);
    copy_bytes(params.dense.data(), host_params.dense.data(), params.dense.size() * sizeof(float));
    copy_bytes(params.expert.data(), host_params.expert.data(),
               params.expert.size() * sizeof(float));
    Transformer model(c, layout);
    model.set_precision(PrecisionRecipe::from_train(precision, {}));
    const int64_t batch = 2, seq = 8;
    std::vector<int32_t> tokens(kTinyTokens), targets(kTinyTargets);
    for (int32_t& t : tokens) t %= static_cast<int32_t>(c.vocab_size);
    int64_t counted = 0;
    for (const int32_t t : targets) counted += t != kIgnoreIndex;
    const DeviceArray<int32_t> tokens_on_device = device_copy(tokens, Device::kCuda);
    const DeviceArray<int32_t> targets_on_device = device_copy(targets, Device::kCuda);
    const DeviceArray<double> divisor_on_device =
        device_copy(std::vector<double>{static_cast<double>(counted)}, Device::kCuda);
    struct Pass {
      std::vector<size_t> copies_in;
      std::vector<HostRead> reads;
      std::vector<float> dense_grads, expert_grads;
    };
    auto pass = [&](const int32_t* token_ids, const int32_t* target_ids,
                    ConstTensorView counted_there) {
      ParamBuffers grads(layout);
      guarded_device::take_host_to_device_copies();
      Pass p;
      {
        const HostReadLog log;
        model.set_next_batch_counts({counted, batch * seq, counted_there});
        model.forward_chunk(0, params, token_ids, nullptr, target_ids, batch, seq, nullptr);
        model.backward(params, grads, 0.75f);
        p.reads = log.reads();
      }
      p.copies_in = guarded_device::take_host_to_device_copies();
      model.read_losses();
      p.dense_grads = host_copy(grads.dense);
      p.expert_grads = host_copy(grads.expert);
      return p;
    };
    pass(tokens.data(), targets.data(), {});  // warms the buffers and tables
    const Pass from_host = pass(tokens.data(), targets.data(), {});
    const Pass from_device = pass(tokens_on_device.data(), targets_on_device.data(),
                                  view(divisor_on_device.data(), {1}));
    const size_t ids = static_cast<size_t>(batch * seq) * sizeof(int32_t);
    EXPECT_EQ(from_host.copies_in, (std::vector<size_t>{ids, sizeof(double), ids}));
    EXPECT_TRUE(from_device.copies_in.empty()) << from_device.copies_in.size() << " copies in";
    EXPECT_TRUE(from_host.reads.empty());
    EXPECT_TRUE(from_device.reads.empty());
    EXPECT_EQ(from_device.dense_grads, from_host.dense_grads);
    EXPECT_EQ(from_device.expert_grads, from_host.expert_grads);
  }
}

TEST(DeviceMemory, IdsInDeviceMemoryNeedTheirCountsFromTheCaller) {
  const ModelConfig c = tiny_moe_config(2);
  const guarded_device::Scope device;
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  Transformer model(c, layout);
  std::vector<int32_t> tokens(kTinyTokens), targets(kTinyTargets);
  for (int32_t& t : tokens) t %= static_cast<int32_t>(c.vocab_size);
  const DeviceArray<int32_t> tokens_on_device = device_copy(tokens, Device::kCuda);
  const DeviceArray<int32_t> targets_on_device = device_copy(targets, Device::kCuda);
  try {
    model.forward_chunk(0, params, tokens_on_device.data(), nullptr, targets_on_device.data(), 2, 8,
                        nullptr);
    FAIL() << "counted the targets in device memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_next_batch_counts"), std::string::npos) << e.what();
  }
}

// The MXFP8 experts: OLMo-core's recipe (the weight gradients in bf16 on the saved inputs
// dequantised, one grouped GEMM on the offsets where they are) reads nothing inside the layers;
// the mx.expert_wgrad variant, which pads each expert's rows to 32 on the host, reads the offsets
// there once per MoE layer.
TEST(DeviceMemory, TheMxfp8ExpertsReadNothingButTheirMxWeightGradientVariantReadsTheOffsets) {
  const ModelConfig c = mxfp8_config();
  for (const bool mx_weight_gradient : {false, true}) {
    SCOPED_TRACE(mx_weight_gradient ? "mx.expert_wgrad" : "OLMo-core's recipe");
    Mxfp8Options options;
    options.expert_wgrad = mx_weight_gradient;
    const PassReads reads =
        host_reads_of_a_pass(c, PrecisionRecipe::from_train(TrainPrecision::kMxfp8, options),
                             ActivationRecompute::kNone);
    int64_t in_layers = 0, all = 0;
    const std::string offsets_copy =
        "copy of " + std::to_string((c.num_experts + 1) * sizeof(int64_t)) + " bytes";
    for (const HostRead& read : reads.pass) {
      all += read.count;
      if (!in_a_layer(read.phase)) continue;
      in_layers += read.count;
      EXPECT_EQ(read.phase, "experts_backward") << read.what;
      EXPECT_EQ(read.what, offsets_copy) << read.phase;
    }
    EXPECT_EQ(in_layers, mx_weight_gradient ? moe_layer_count(c) : 0);
    EXPECT_EQ(all, in_layers);
    ASSERT_EQ(reads.losses.size(), 1u);
    EXPECT_EQ(reads.losses[0].what, kLossesCopy);
  }
}

TEST(DeviceMemory, Mxfp8TransformerPassRunsOnDeviceMemoryWithTheCpusBits) {
  expect_same_pass_on_the_device(mxfp8_config(),
                                 PrecisionRecipe::from_train(TrainPrecision::kMxfp8, {}),
                                 ActivationRecompute::kNone, -1);
}

}  // namespace
}  // namespace moecore
