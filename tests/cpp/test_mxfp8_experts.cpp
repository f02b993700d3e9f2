// train.precision = "mxfp8" (model/precision_recipe.h): OLMo-core 3's MXFP8 recipe. The model's
// grouped experts are checked bit for bit against the recipe written out with the plain-loop
// oracles of kernels/reference (each checked against the backend by test_kernel_ops_mx.cpp and
// against torchao by tests/reference/test_mx_conformance.py): forward and input-gradient GEMMs on
// MX operands (inputs and output gradients quantised along the contraction dimension, weights from
// the once-per-step caches in both orientations), the weight gradient in bf16 (the backend's bf16
// GEMM, so equal up to its summation order: summation_order_bound) on the inputs dequantised from
// the saved MX copies, or with mxfp8_expert_wgrad an MX GEMM
// along the tokens (each expert's rows zero-padded to a multiple of 32). The same for the shared
// expert, which OLMo-core's recipe runs as an expert (its weight gradient in bf16 on the inputs,
// which OLMo-core saves in bf16), and for the MXFP8 linear of mxfp8_dense (all three GEMMs). Also:
// what the caches hold and when they are remade, that the MoE block keeps no fp32 expert inputs
// after the forward, and the one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/ignore_index.h"
#include "core/mx_types.h"
#include "core/workspace.h"
#include "kernels/ops.h"
#include "model/grouped_experts.h"
#include "model/linear.h"
#include "model/moe_block.h"
#include "model/mx_weight_caches.h"
#include "model/params.h"
#include "model/swiglu_mlp.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"
#include "tiny_moe_pass.h"

namespace moecore {
namespace {

namespace ref = kernels::reference;
constexpr int64_t kBlock = mx::kMxBlock;

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// A model whose expert dimensions are whole MX blocks: d = 64, H = 32, three experts; the first
// layer is dense when there are several.
ModelConfig mx_config(int64_t layers) {
  ModelConfig c = tiny_moe_config(layers);
  c.first_k_dense_replace = layers > 1 ? 1 : 0;
  c.hidden_size = 64;
  c.head_dim = 32;
  c.num_experts = 3;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 64;
  c.shared_expert_intermediate_size = 32;
  return c;
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// An MX operand held by the test: codes and scales of x [batch, rows, cols] along cols.
struct Quantized {
  std::vector<uint8_t> codes, scales;
  int64_t batch, rows, cols;
  MxOperandView view() const {
    return {ConstTensorView(codes.data(), {batch, rows, cols}, DType::kE4m3),
            ConstTensorView(scales.data(), {batch, rows, cols / kBlock}, DType::kE8m0)};
  }
  MxOperandView matrix() const {  // batch 1 as [rows, cols]
    return {ConstTensorView(codes.data(), {rows, cols}, DType::kE4m3),
            ConstTensorView(scales.data(), {rows, cols / kBlock}, DType::kE8m0)};
  }
};

// The oracle's quantisations: x [batch, rows, cols] along cols, or (transposed) along rows.
Quantized quantize(const float* x, int64_t batch, int64_t rows, int64_t cols, mx::ScaleMode mode,
                   bool transposed = false) {
  Quantized q;
  q.batch = batch;
  q.rows = transposed ? cols : rows;
  q.cols = transposed ? rows : cols;
  q.codes.resize(static_cast<size_t>(batch * rows * cols));
  q.scales.resize(static_cast<size_t>(batch * rows * cols / kBlock));
  const TensorView codes(q.codes.data(), {batch, q.rows, q.cols}, DType::kE4m3);
  const TensorView scales(q.scales.data(), {batch, q.rows, q.cols / kBlock}, DType::kE8m0);
  const ConstTensorView values(x, {batch, rows, cols}, DType::kF32);
  if (transposed)
    ref::mx_quantize_transposed(values, mode, codes, scales);
  else
    ref::mx_quantize(values, mode, codes, scales);
  return q;
}

struct ExpertPass {
  std::vector<float> y, dx, dw_gate_up, dw_down;
  // Where the weight gradients come from the backend's bf16 GEMM: per element, how far two fp32
  // sums of the same products may part (empty where they are MX GEMMs, exact).
  std::vector<double> dw_gate_up_bound, dw_down_bound;
};

// Two fp32 sums of the same n exact products (bf16 x bf16 values are exact in fp32) in any two
// orders each lie within gamma_n * sum |products| of the exact sum (Higham, Accuracy and Stability
// of Numerical Algorithms, 2nd ed., eq. 4.4; gamma_n = n u / (1 - n u), u = 2^-24), so within
// twice that of each other. oneDNN's sgemm, which the bf16 GEMM runs on without bf16
// instructions, sums in an order that depends on its thread count: the model runs these experts'
// GEMMs one per thread, the oracle on all threads.
double summation_order_bound(int64_t n, double sum_of_magnitudes) {
  const double nu = static_cast<double>(n) * 0x1p-24;
  return 2.0 * nu / (1.0 - nu) * sum_of_magnitudes;
}

void expect_within_bound(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& bound, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (bound.empty()) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  ASSERT_EQ(bound.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])), bound[i])
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
}

// The recipe written out with the reference ops (the bf16 weight-gradient GEMM excepted, see
// there): x [R, d], dy [R, d], weights fp32.
ExpertPass oracle(const ModelConfig& c, const std::vector<int64_t>& offsets,
                  const std::vector<float>& x, const std::vector<float>& dy, const float* gate_up,
                  const float* down, const PrecisionRecipe& recipe) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const auto local = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t rows = offsets.back();
  const ConstTensorView offsets_tensor = view(offsets.data(), {local + 1});
  const mx::ScaleMode mode = recipe.mx.scale_mode;
  ExpertPass out;
  std::vector<float> gu(static_cast<size_t>(rows * 2 * h)), act(static_cast<size_t>(rows * h));
  out.y.resize(static_cast<size_t>(rows * d));
  const Quantized xq = quantize(x.data(), 1, rows, d, mode);
  const Quantized gate_up_q = quantize(gate_up, local, 2 * h, d, mode);
  const Quantized down_q = quantize(down, local, d, h, mode);
  ref::mx_grouped_gemm_forward(xq.matrix(), gate_up_q.view(), offsets_tensor,
                               view(gu.data(), {rows, 2 * h}));
  ref::swiglu_forward(view(gu.data(), {rows, 2 * h}), view(act.data(), {rows, h}));
  const Quantized act_q = quantize(act.data(), 1, rows, h, mode);
  ref::mx_grouped_gemm_forward(act_q.matrix(), down_q.view(), offsets_tensor,
                               view(out.y.data(), {rows, d}));

  // Weight gradient of one GEMM: dw[e] += dy_e^T . in_e.
  auto weight_grads = [&](const std::vector<float>& g, int64_t out_dim, const Quantized& saved,
                          const std::vector<float>& in_fp32, int64_t in_dim, std::vector<float>& dw,
                          std::vector<double>& bound) {
    dw.assign(static_cast<size_t>(local * out_dim * in_dim), 0.0f);
    if (!recipe.mx.expert_wgrad) bound.assign(dw.size(), 0.0);
    std::vector<float> in(static_cast<size_t>(rows * in_dim));
    ref::mx_dequantize(saved.matrix(), view(in.data(), {rows, in_dim}));
    for (int64_t e = 0; e < local; ++e) {
      const int64_t begin = offsets[static_cast<size_t>(e)],
                    n = offsets[static_cast<size_t>(e) + 1] - begin;
      if (n == 0) continue;
      float* dw_e = dw.data() + e * out_dim * in_dim;
      if (!recipe.mx.expert_wgrad) {
        // The backend's bf16 GEMM: bf16 GEMMs are not bit-identical across backends (oneDNN
        // sums in its own order), MX GEMMs are.
        kernels::matmul(view(g.data() + begin * out_dim, {n, out_dim}), true,
                        view(in.data() + begin * in_dim, {n, in_dim}), false, 1.0f, 1.0f,
                        view(dw_e, {out_dim, in_dim}), kernels::MatmulPrecision::kBf16);
        for (int64_t o = 0; o < out_dim; ++o)
          for (int64_t i = 0; i < in_dim; ++i) {
            double magnitudes = 0.0;
            for (int64_t t = begin; t < begin + n; ++t)
              magnitudes += std::abs(static_cast<double>(round_to_bf16(g[at(t * out_dim + o)])) *
                                     static_cast<double>(in[at(t * in_dim + i)]));
            bound[at((e * out_dim + o) * in_dim + i)] = summation_order_bound(n, magnitudes);
          }
        continue;
      }
      const int64_t padded = (n + kBlock - 1) / kBlock * kBlock;
      std::vector<float> g_pad(static_cast<size_t>(padded * out_dim), 0.0f);
      std::vector<float> in_pad(static_cast<size_t>(padded * in_dim), 0.0f);
      std::copy_n(g.data() + begin * out_dim, n * out_dim, g_pad.begin());
      std::copy_n(in_fp32.data() + begin * in_dim, n * in_dim, in_pad.begin());
      const Quantized g_t = quantize(g_pad.data(), 1, padded, out_dim, mode, true);
      const Quantized in_t = quantize(in_pad.data(), 1, padded, in_dim, mode, true);
      ref::mx_matmul(g_t.matrix(), in_t.matrix(), 1.0f, 1.0f, view(dw_e, {out_dim, in_dim}));
    }
  };

  std::vector<float> dact(static_cast<size_t>(rows * h)), dgu(static_cast<size_t>(rows * 2 * h));
  out.dx.resize(static_cast<size_t>(rows * d));
  const Quantized dy_q = quantize(dy.data(), 1, rows, d, mode);
  const Quantized down_t = quantize(down, local, d, h, mode, true);  // [E, H, d] along d
  ref::mx_grouped_gemm_backward_input(dy_q.matrix(), down_t.view(), offsets_tensor,
                                      view(dact.data(), {rows, h}));
  weight_grads(dy, d, act_q, act, h, out.dw_down, out.dw_down_bound);
  ref::swiglu_backward(view(dact.data(), {rows, h}), view(gu.data(), {rows, 2 * h}),
                       view(dgu.data(), {rows, 2 * h}));
  const Quantized dgu_q = quantize(dgu.data(), 1, rows, 2 * h, mode);
  const Quantized gate_up_t = quantize(gate_up, local, 2 * h, d, mode, true);  // [E, d, 2H]
  ref::mx_grouped_gemm_backward_input(dgu_q.matrix(), gate_up_t.view(), offsets_tensor,
                                      view(out.dx.data(), {rows, d}));
  weight_grads(dgu, 2 * h, xq, x, d, out.dw_gate_up, out.dw_gate_up_bound);
  return out;
}

PrecisionRecipe mx_recipe(bool expert_wgrad, mx::ScaleMode mode) {
  return PrecisionRecipe::from_train(TrainPrecision::kMxfp8,
                                     {.expert_wgrad = expert_wgrad, .scale_mode = mode});
}

struct Case {
  bool expert_wgrad;
  mx::ScaleMode mode;
};

class MxExperts : public ::testing::TestWithParam<Case> {};

// A one-layer model's seeded weights and the MX caches the model makes of them for a case.
struct MxLayer {
  MxLayer(const Case& p, uint32_t seed)
      : config(mx_config(1)),
        layout(ParamLayout::build(config)),
        params(layout),
        recipe(mx_recipe(p.expert_wgrad, p.mode)),
        caches(mx_weight_ranges(config, layout, {}, recipe), p.mode) {
    fill_tiny_params(layout, seed, params);
    caches.refresh(params);
  }
  const ModelConfig config;
  const ParamLayout layout;
  ParamBuffers params;
  const PrecisionRecipe recipe;
  MxWeightCaches caches;
};

// Expert 0 gets no rows, expert 1 37 (one whole block of tokens and a partial one), expert 2 13.
TEST_P(MxExperts, TheModelsExpertsAreTheRecipeWrittenOutWithTheReferenceOps) {
  const Case p = GetParam();
  MxLayer layer(p, 11);
  const ModelConfig& c = layer.config;
  const ParamLayout& layout = layer.layout;
  const ParamBuffers& params = layer.params;
  const PrecisionRecipe& recipe = layer.recipe;
  MxWeightCaches& caches = layer.caches;
  const LayerSpecs s = layout.layer_specs(0);
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size, local = c.num_experts;
  const float* gate_up = params.at(*s.expert_gate);
  const float* down = params.at(*s.expert_down);

  const std::vector<int64_t> offsets = {0, 0, 37, 50};
  const int64_t r = offsets.back();
  ExpertRows rows;
  rows.received = r;
  rows.expert_offsets = device_copy(offsets);
  const std::vector<float> x = random_values(static_cast<size_t>(r * d), 3, 1.0f);
  rows.x = device_copy(x);
  rows.gu.resize(static_cast<size_t>(r * 2 * h));
  rows.act.resize(static_cast<size_t>(r * h));
  const std::vector<float> dy = random_values(static_cast<size_t>(r * d), 4, 0.01f);

  MoeWeights w{};
  w.experts_gate_up = view(gate_up, {local, 2 * h, d});
  w.experts_down = view(down, {local, d, h});
  w.experts_gate_up_mx = caches.find(s.expert_gate->group, s.expert_gate->offset);
  w.experts_down_mx = caches.find(s.expert_down->group, s.expert_down->offset);
  ASSERT_NE(w.experts_gate_up_mx, nullptr);
  ASSERT_NE(w.experts_down_mx, nullptr);
  std::vector<float> dw_gate_up(static_cast<size_t>(local * 2 * h * d), 0.0f);
  std::vector<float> dw_down(static_cast<size_t>(local * d * h), 0.0f);
  MoeGrads dw{};
  dw.experts_gate_up = dw_gate_up.data();
  dw.experts_down = dw_down.data();

  std::vector<float> y(static_cast<size_t>(r * d)), dx(static_cast<size_t>(r * d));
  grouped_experts_forward(recipe, c, local, w, rows, y.data());
  if (!p.expert_wgrad) {  // what MoeBlock does: the backward must not need the fp32 inputs
    DeviceArray<float>().swap(rows.x);
    DeviceArray<float>().swap(rows.act);
  }
  Workspace workspace;
  grouped_experts_backward(recipe, c, local, w, dw, rows, dy.data(), dx.data(), workspace);

  const ExpertPass want = oracle(c, offsets, x, dy, gate_up, down, recipe);
  EXPECT_EQ(y, want.y);
  EXPECT_EQ(dx, want.dx);
  expect_within_bound(dw_gate_up, want.dw_gate_up, want.dw_gate_up_bound, "dw_gate_up");
  expect_within_bound(dw_down, want.dw_down, want.dw_down_bound, "dw_down");
  // Not vacuous: the MX results are not the bf16 ones.
  ExpertRows bf16_rows;
  bf16_rows.received = r;
  bf16_rows.expert_offsets = device_copy(offsets);
  bf16_rows.x = device_copy(x);
  bf16_rows.gu.resize(rows.gu.size());
  bf16_rows.act.resize(static_cast<size_t>(r * h));
  std::vector<float> y_bf16(y.size());
  grouped_experts_forward(PrecisionRecipe::from_train(TrainPrecision::kBf16, {}), c, local, w,
                          bf16_rows, y_bf16.data());
  EXPECT_NE(y, y_bf16);
}

INSTANTIATE_TEST_SUITE_P(Recipes, MxExperts,
                         ::testing::Values(Case{false, mx::ScaleMode::kRceil},
                                           Case{false, mx::ScaleMode::kFloor},
                                           Case{true, mx::ScaleMode::kRceil},
                                           Case{true, mx::ScaleMode::kFloor}),
                         [](const ::testing::TestParamInfo<Case>& test) {
                           return std::string(test.param.expert_wgrad ? "MxWgrad" : "Bf16Wgrad") +
                                  (test.param.mode == mx::ScaleMode::kRceil ? "Rceil" : "Floor");
                         });

// The shared expert under train.precision = "mxfp8", its caches from mx_weight_ranges as the
// model makes them: forward and input gradient MX GEMMs on the once-per-step caches, the weight
// gradient in bf16 on the fp32 inputs and output gradients (the backend's bf16 GEMM rounds them,
// as OLMo-core's grouped_mm multiplies its bf16 tensors), or under mxfp8_expert_wgrad an MX GEMM
// along the tokens. 37 tokens: one whole block of them and a zero-padded one.
TEST_P(MxExperts, TheSharedExpertIsAnExpertOfTheRecipe) {
  const Case p = GetParam();
  MxLayer layer(p, 16);
  const ModelConfig& c = layer.config;
  const ParamLayout& layout = layer.layout;
  const ParamBuffers& params = layer.params;
  const PrecisionRecipe& recipe = layer.recipe;
  MxWeightCaches& caches = layer.caches;
  const LayerSpecs s = layout.layer_specs(0);
  const int64_t rows = 37, d = c.hidden_size, hs = c.shared_expert_intermediate_size;
  const float* gate_up = params.at(*s.shared_gate);  // gate then up: [2Hs, d]
  const float* down = params.at(*s.shared_down);     // [d, Hs]
  const LinearWeight w_gate_up(view(gate_up, {2 * hs, d}),
                               caches.find(s.shared_gate->group, s.shared_gate->offset));
  const LinearWeight w_down(view(down, {d, hs}),
                            caches.find(s.shared_down->group, s.shared_down->offset));
  ASSERT_NE(w_gate_up.mx, nullptr);
  ASSERT_NE(w_down.mx, nullptr);
  EXPECT_EQ(w_gate_up.mx->mx_weight_grad, p.expert_wgrad);
  // Kept in fp32: the MX GEMMs quantise the fp32 values.
  ASSERT_EQ(kept_mlp_act_dtype(recipe, SwigluMlp::kSharedExpert), DType::kF32);

  const std::vector<float> x = random_values(static_cast<size_t>(rows * d), 17, 1.0f);
  const std::vector<float> dy = random_values(static_cast<size_t>(rows * d), 18, 0.01f);
  std::vector<float> gu(static_cast<size_t>(rows * 2 * hs)), act(static_cast<size_t>(rows * hs));
  std::vector<float> y(static_cast<size_t>(rows * d)), dx(y.size());
  std::vector<float> dw_gate_up(static_cast<size_t>(2 * hs * d), 0.0f);
  std::vector<float> dw_down(static_cast<size_t>(d * hs), 0.0f);
  std::vector<float> scratch_dact(static_cast<size_t>(rows * hs)),
      scratch_dgu(static_cast<size_t>(rows * 2 * hs));
  const SwigluShape shape{rows, d, hs};
  swiglu_mlp_forward(recipe.dense_mlp, shape, x.data(), w_gate_up, w_down, gu.data(),
                     view(act.data(), {rows, hs}), y.data());
  swiglu_mlp_backward(recipe.dense_mlp, shape, dy.data(), x.data(), w_gate_up, w_down, gu.data(),
                      view(act.data(), {rows, hs}), dx.data(), dw_gate_up.data(), dw_down.data(),
                      scratch_dact.data(), view(scratch_dgu.data(), {rows, 2 * hs}), false);

  // The recipe with the reference ops.
  const mx::ScaleMode mode = p.mode;
  std::vector<float> want_gu(gu.size()), want_act(act.size()), want_y(y.size());
  ref::mx_matmul(quantize(x.data(), 1, rows, d, mode).matrix(),
                 quantize(gate_up, 1, 2 * hs, d, mode).matrix(), 1.0f, 0.0f,
                 view(want_gu.data(), {rows, 2 * hs}));
  ref::swiglu_forward(view(want_gu.data(), {rows, 2 * hs}), view(want_act.data(), {rows, hs}));
  ref::mx_matmul(quantize(want_act.data(), 1, rows, hs, mode).matrix(),
                 quantize(down, 1, d, hs, mode).matrix(), 1.0f, 0.0f,
                 view(want_y.data(), {rows, d}));
  EXPECT_EQ(gu, want_gu);
  EXPECT_EQ(y, want_y);

  // dw (+=) [out, in] of dy [rows, out] and in [rows, in]: MX along the tokens, or the backend's
  // bf16 GEMM, within the summation-order bound of the products of the bf16 roundings.
  auto weight_grad = [&](const std::vector<float>& g, int64_t out_dim, const std::vector<float>& in,
                         int64_t in_dim, std::vector<double>& bound) {
    std::vector<float> dw(static_cast<size_t>(out_dim * in_dim), 0.0f);
    if (p.expert_wgrad) {
      const int64_t padded = 64;
      std::vector<float> g_pad(static_cast<size_t>(padded * out_dim), 0.0f);
      std::vector<float> in_pad(static_cast<size_t>(padded * in_dim), 0.0f);
      std::copy(g.begin(), g.end(), g_pad.begin());
      std::copy(in.begin(), in.end(), in_pad.begin());
      ref::mx_matmul(quantize(g_pad.data(), 1, padded, out_dim, mode, true).matrix(),
                     quantize(in_pad.data(), 1, padded, in_dim, mode, true).matrix(), 1.0f, 1.0f,
                     view(dw.data(), {out_dim, in_dim}));
      return dw;
    }
    kernels::matmul(view(g.data(), {rows, out_dim}), true, view(in.data(), {rows, in_dim}), false,
                    1.0f, 1.0f, view(dw.data(), {out_dim, in_dim}),
                    kernels::MatmulPrecision::kBf16);
    bound.assign(dw.size(), 0.0);
    for (int64_t o = 0; o < out_dim; ++o)
      for (int64_t i = 0; i < in_dim; ++i) {
        double magnitudes = 0.0;
        for (int64_t t = 0; t < rows; ++t)
          magnitudes += std::abs(static_cast<double>(round_to_bf16(g[at(t * out_dim + o)])) *
                                 static_cast<double>(round_to_bf16(in[at(t * in_dim + i)])));
        bound[at(o * in_dim + i)] = summation_order_bound(rows, magnitudes);
      }
    return dw;
  };
  std::vector<float> dact(act.size()), dgu(gu.size()), want_dx(dx.size());
  ref::mx_matmul(quantize(dy.data(), 1, rows, d, mode).matrix(),
                 quantize(down, 1, d, hs, mode, true).matrix(), 1.0f, 0.0f,
                 view(dact.data(), {rows, hs}));
  std::vector<double> down_bound, gate_up_bound;
  const std::vector<float> want_dw_down = weight_grad(dy, d, want_act, hs, down_bound);
  ref::swiglu_backward(view(dact.data(), {rows, hs}), view(want_gu.data(), {rows, 2 * hs}),
                       view(dgu.data(), {rows, 2 * hs}));
  ref::mx_matmul(quantize(dgu.data(), 1, rows, 2 * hs, mode).matrix(),
                 quantize(gate_up, 1, 2 * hs, d, mode, true).matrix(), 1.0f, 0.0f,
                 view(want_dx.data(), {rows, d}));
  const std::vector<float> want_dw_gate_up = weight_grad(dgu, 2 * hs, x, d, gate_up_bound);
  EXPECT_EQ(dx, want_dx);
  expect_within_bound(dw_down, want_dw_down, down_bound, "shared dw_down");
  expect_within_bound(dw_gate_up, want_dw_gate_up, gate_up_bound, "shared dw_gate_up");
  // Not vacuous: the bf16 recipe's shared expert differs.
  std::vector<float> y_bf16(y.size());
  swiglu_mlp_forward(recipe.dense_mlp, shape, x.data(), view(gate_up, {2 * hs, d}),
                     view(down, {d, hs}), gu.data(), view(act.data(), {rows, hs}), y_bf16.data());
  EXPECT_NE(y, y_bf16);
}

// train.mxfp8_dense: a linear layer whose weight carries MX caches runs all three GEMMs in MXFP8,
// the weight gradient on dy and x quantised along the tokens (37 rows: one whole block and a
// zero-padded one).
TEST(MxLinear, AllThreeGemmsAreTheRecipeWrittenOutWithTheReferenceOps) {
  const int64_t rows = 37, in = 64, out = 96;
  for (const mx::ScaleMode mode : {mx::ScaleMode::kRceil, mx::ScaleMode::kFloor}) {
    const std::vector<float> w = random_values(static_cast<size_t>(out * in), 6, 0.1f);
    const std::vector<float> x = random_values(static_cast<size_t>(rows * in), 7, 1.0f);
    const std::vector<float> dy = random_values(static_cast<size_t>(rows * out), 8, 0.01f);
    const std::vector<float> dx_before = random_values(static_cast<size_t>(rows * in), 9, 0.1f);
    const std::vector<float> dw_before = random_values(static_cast<size_t>(out * in), 10, 0.1f);
    // The weight's caches as MxWeightCaches makes them (checked against it below).
    const Quantized w_in = quantize(w.data(), 1, out, in, mode);
    const Quantized w_out = quantize(w.data(), 1, out, in, mode, true);
    const MxWeight caches{w_in.view(), w_out.view(), mode};
    const LinearWeight weight(view(w.data(), {out, in}), &caches);

    std::vector<float> y(static_cast<size_t>(rows * out));
    linear_forward(kernels::MatmulPrecision::kBf16, x.data(), weight, y.data(), rows, in, out);
    std::vector<float> want_y(y.size());
    ref::mx_matmul(quantize(x.data(), 1, rows, in, mode).matrix(), w_in.matrix(), 1.0f, 0.0f,
                   view(want_y.data(), {rows, out}));
    EXPECT_EQ(y, want_y);

    for (const bool accumulate : {false, true}) {
      std::vector<float> dx = dx_before, dw = dw_before;
      linear_backward(kernels::MatmulPrecision::kBf16, dy.data(), x.data(), weight, dx.data(),
                      dw.data(), rows, in, out, accumulate);
      std::vector<float> want_dx = dx_before, want_dw = dw_before;
      ref::mx_matmul(quantize(dy.data(), 1, rows, out, mode).matrix(), w_out.matrix(), 1.0f,
                     accumulate ? 1.0f : 0.0f, view(want_dx.data(), {rows, in}));
      const int64_t padded = 64;
      std::vector<float> dy_pad(static_cast<size_t>(padded * out), 0.0f);
      std::vector<float> x_pad(static_cast<size_t>(padded * in), 0.0f);
      std::copy(dy.begin(), dy.end(), dy_pad.begin());
      std::copy(x.begin(), x.end(), x_pad.begin());
      ref::mx_matmul(quantize(dy_pad.data(), 1, padded, out, mode, true).matrix(),
                     quantize(x_pad.data(), 1, padded, in, mode, true).matrix(), 1.0f, 1.0f,
                     view(want_dw.data(), {out, in}));
      EXPECT_EQ(dx, want_dx) << "accumulate " << accumulate;
      EXPECT_EQ(dw, want_dw) << "accumulate " << accumulate;
    }
  }
}

TEST(MxWeightCaches, WithMxfp8DenseEveryProjectionAndMlpIsCachedAndNoneIsCopied) {
  const ModelConfig c = mx_config(3);
  const ParamLayout layout = ParamLayout::build(c);
  const PrecisionRecipe recipe = PrecisionRecipe::from_train(
      TrainPrecision::kMxfp8, {.expert_wgrad = false, .dense = true, .scale_mode = {}});
  // Per layer: q, k, v, o; then the dense MLP (layer 0) or shared expert + experts (1, 2).
  EXPECT_EQ(mx_weight_ranges(c, layout, {}, recipe).size(), 4u * 3 + 2 + 2 * 4);
  Transformer model(c, layout);
  model.set_precision(recipe);
  // Only the LM head is left to copy to bf16.
  EXPECT_EQ(model.bf16_weight_copies().numel(), static_cast<size_t>(c.vocab_size * c.hidden_size));
  ParamBuffers params(layout);
  fill_tiny_params(layout, 15, params);
  model.forward(params, kTinyTokens.data(), kTinyTargets.data(), 2, 8);  // makes the caches
  const MxWeight* q = model.mx_weight_caches().find(layout.layer_specs(1).q_proj->group,
                                                    layout.layer_specs(1).q_proj->offset);
  ASSERT_NE(q, nullptr);
  const Quantized want = quantize(params.at(*layout.layer_specs(1).q_proj), 1, c.q_size(),
                                  c.hidden_size, mx::ScaleMode::kRceil);
  const auto* codes = static_cast<const uint8_t*>(q->along_in.codes.raw());
  EXPECT_EQ(std::vector<uint8_t>(codes, codes + want.codes.size()), want.codes);
}

TEST(MxWeightCaches, BothOrientationsOfEveryExpertBlockAndNothingElse) {
  const ModelConfig c = mx_config(3);  // a dense first layer, then two MoE layers
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  fill_tiny_params(layout, 12, params);
  const PrecisionRecipe recipe = mx_recipe(false, mx::ScaleMode::kRceil);
  const std::vector<MxWeightRange> ranges = mx_weight_ranges(c, layout, {}, recipe);
  // Gate_up and down of the experts and of the shared expert, in the two MoE layers.
  ASSERT_EQ(ranges.size(), 8u);
  EXPECT_TRUE(
      mx_weight_ranges(c, layout, {}, PrecisionRecipe::from_train(TrainPrecision::kBf16, {}))
          .empty());
  MxWeightCaches caches(ranges, mx::ScaleMode::kRceil);
  const int64_t e = c.num_experts, h = c.moe_intermediate_size, d = c.hidden_size;
  const int64_t hs = c.shared_expert_intermediate_size;
  const int64_t mx_numel = 2 * 3 * (e * h + hs) * d;  // two layers of gate, up and down
  EXPECT_EQ(caches.bytes(), static_cast<size_t>(2 * mx_numel * (kBlock + 1) / kBlock));
  caches.refresh(params);
  const LayerSpecs s = layout.layer_specs(2);
  const MxWeight* down = caches.find(s.expert_down->group, s.expert_down->offset);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(caches.find(s.q_proj->group, s.q_proj->offset), nullptr) << "attention stays bf16";
  EXPECT_EQ(
      caches.find(layout.layer_specs(0).mlp_gate->group, layout.layer_specs(0).mlp_gate->offset),
      nullptr)
      << "the dense layer's MLP stays bf16";
  const MxWeight* shared = caches.find(s.shared_gate->group, s.shared_gate->offset);
  ASSERT_NE(shared, nullptr) << "the shared expert is an expert";
  EXPECT_FALSE(shared->mx_weight_grad) << "its weight gradient in bf16";
  EXPECT_FALSE(down->mx_weight_grad);
  const float* fp32 = params.at(*s.expert_down);
  const Quantized along_in = quantize(fp32, e, d, h, mx::ScaleMode::kRceil);
  const Quantized along_out = quantize(fp32, e, d, h, mx::ScaleMode::kRceil, true);
  auto bytes = [](const ConstTensorView& v) {
    const auto* p = static_cast<const uint8_t*>(v.raw());
    return std::vector<uint8_t>(p, p + v.numel());
  };
  EXPECT_EQ(bytes(down->along_in.codes), along_in.codes);
  EXPECT_EQ(bytes(down->along_in.scales), along_in.scales);
  EXPECT_EQ(bytes(down->along_out.codes), along_out.codes);
  EXPECT_EQ(bytes(down->along_out.scales), along_out.scales);
  EXPECT_EQ(down->along_out.codes.size(1), h);
  // The bf16 copies leave the MX experts and shared experts out (their weight gradient reads no
  // weight).
  Transformer model(c, layout);
  model.set_precision(recipe);
  EXPECT_EQ(model.mx_weight_caches().bytes(), caches.bytes());
  model.set_precision(PrecisionRecipe::from_train(TrainPrecision::kBf16, {}));
  const size_t bf16_numel = model.bf16_weight_copies().numel();
  model.set_precision(recipe);
  EXPECT_EQ(model.bf16_weight_copies().numel(), bf16_numel - static_cast<size_t>(mx_numel));
}

// The error names the checkpoint's tensor with its own shape (gate_proj [H, d], not moecore's
// fused [2H, d]) and the config key at fault.
TEST(MxWeightCaches, ExpertsWhoseDimensionsAreNotWholeBlocksAreAnError) {
  struct BadWidth {
    int64_t ModelConfig::*width;
    const char* tensor;
    const char* key;
  };
  for (const BadWidth& bad :
       {BadWidth{&ModelConfig::moe_intermediate_size,
                 "model.layers.1.mlp.experts.0.gate_proj.weight is [48, 64]",
                 "model.moe_intermediate_size = 48 is not a multiple of 32"},
        BadWidth{&ModelConfig::shared_expert_intermediate_size,
                 "model.layers.1.mlp.shared_expert.gate_proj.weight is [48, 64]",
                 "model.shared_expert_intermediate_size = 48 is not a multiple of 32"}}) {
    ModelConfig c = mx_config(2);
    c.*bad.width = 48;
    const ParamLayout layout = ParamLayout::build(c);
    Transformer model(c, layout);
    try {
      model.set_precision(mx_recipe(false, mx::ScaleMode::kRceil));
      ADD_FAILURE() << "no error for " << bad.key;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[mxfp8]"), std::string::npos) << what;
      EXPECT_NE(what.find(bad.tensor), std::string::npos) << what;
      EXPECT_NE(what.find(bad.key), std::string::npos) << what;
      EXPECT_NE(what.find("multiples of 32"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

// The caches are remade with the bf16 copies: at every forward by default, else only after
// weights_changed(); a stale cache is read until then (the GEMMs read the caches, not the weights).
TEST(MxWeightCaches, RemadeWithTheBf16CopiesAndReadByTheExpertGemms) {
  // 1.25: more than an E4M3 step (2^-3) for every weight.
  expect_copies_remade_only_when_told(mx_config(2), mx_recipe(false, mx::ScaleMode::kRceil), 13,
                                      1.25f);
}

// After the MoE block's forward a layer's cache holds the experts' inputs in MXFP8 only
// (OLMo-core's saved activation), unless the MX weight gradient needs them in fp32.
TEST(MxExpertsMemory, TheBlockKeepsOnlyTheMxCopiesOfTheExpertInputs) {
  const ModelConfig c = mx_config(1);
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  fill_tiny_params(layout, 14, params);
  const int64_t tokens = 40, d = c.hidden_size;
  for (const bool expert_wgrad : {false, true}) {
    const PrecisionRecipe recipe = mx_recipe(expert_wgrad, mx::ScaleMode::kRceil);
    MoeBlock block(c);
    block.set_precision(recipe);
    const LayerSpecs s = layout.layer_specs(0);
    MxWeightCaches caches(mx_weight_ranges(c, layout, {}, recipe), recipe.mx.scale_mode);
    caches.refresh(params);
    const int64_t h = c.moe_intermediate_size, e = c.num_experts;
    MoeWeights w{};
    w.router = params.at(*s.router);
    w.experts_gate_up = view(params.at(*s.expert_gate), {e, 2 * h, d});
    w.experts_down = view(params.at(*s.expert_down), {e, d, h});
    w.shared_gate_up = view(params.at(*s.shared_gate), {2 * c.shared_expert_intermediate_size, d});
    w.shared_down = view(params.at(*s.shared_down), {d, c.shared_expert_intermediate_size});
    w.shared_gate_up.mx = caches.find(s.shared_gate->group, s.shared_gate->offset);
    w.shared_down.mx = caches.find(s.shared_down->group, s.shared_down->offset);
    w.experts_gate_up_mx = caches.find(s.expert_gate->group, s.expert_gate->offset);
    w.experts_down_mx = caches.find(s.expert_down->group, s.expert_down->offset);
    const std::vector<float> x = random_values(static_cast<size_t>(tokens * d), 5, 1.0f);
    std::vector<float> y(x.size());
    MoeCache cache;
    Workspace forward_workspace;
    block.forward(w, x.data(), tokens, y.data(), cache, forward_workspace);
    const ExpertRows& rows = std::get<LocalDispatch::Cache>(cache.dispatch).experts;
    const auto routed = static_cast<size_t>(tokens * c.num_experts_per_tok);
    EXPECT_EQ(rows.x_codes.size(), routed * static_cast<size_t>(d));
    EXPECT_EQ(rows.act_codes.size(), routed * static_cast<size_t>(h));
    EXPECT_EQ(rows.x.size(), expert_wgrad ? routed * static_cast<size_t>(d) : 0u);
    EXPECT_EQ(rows.act.size(), expert_wgrad ? routed * static_cast<size_t>(h) : 0u);
  }
}

}  // namespace
}  // namespace moecore
