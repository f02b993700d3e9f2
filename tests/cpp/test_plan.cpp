// The planner (src/plan): parameter counts against a hand count, the layout errors shared with the
// trainer, memory per rank (ZeRO-1 sharding, pipeline in-flight micro-batches from the schedule,
// rowwise capacity) and bytes per collective against hand formulas.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"
#include "plan/plan.h"
#include "plan_test_config.h"
#include "train/run_config.h"

namespace moecore::plan {
namespace {

// d 32, 4 layers (layer 0 dense), 4 heads / 2 KV heads of 8, 8 experts top-2 of width 16, a shared
// expert of 24, vocabulary 64, untied.
TEST(PlanParams, MatchHandCount) {
  const ParamCounts p = count_params(small_config().model);
  const int64_t d = 32, v = 64, qs = 32, kvs = 16;
  EXPECT_EQ(p.embedding, v * d);
  EXPECT_EQ(p.lm_head, v * d);
  EXPECT_EQ(p.attention, 4 * (2 * d * qs + 2 * d * kvs + qs + kvs));
  EXPECT_EQ(p.norms, 4 * 2 * d + d);
  EXPECT_EQ(p.dense_mlp, 3 * d * 48);
  EXPECT_EQ(p.routers, 3 * 8 * d);
  EXPECT_EQ(p.shared_experts, 3 * 3 * d * 24);
  EXPECT_EQ(p.routed_experts, 3 * 8 * 3 * d * 16);
  EXPECT_EQ(p.total, p.embedding + p.lm_head + p.attention + p.norms + p.dense_mlp + p.routers +
                         p.shared_experts + p.routed_experts);
  EXPECT_EQ(p.active, p.total - p.routed_experts + 3 * 2 * 3 * d * 16);
}

TEST(PlanParams, TiedEmbeddingHasNoSeparateHead) {
  const ParamCounts p = count_params(small_config({"model.tie_word_embeddings=true"}).model);
  EXPECT_EQ(p.lm_head, 0);
  EXPECT_EQ(p.embedding, 64 * 32);
}

void expect_layout_error(const RunConfig& config, int64_t world, const std::string& needle) {
  try {
    (void)make_plan(config, world, kNoRuntime);
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(PlanLayout, ImpossibleLayoutsNameTheirConstraint) {
  expect_layout_error(small_config({"parallel.ep=3"}), 3,
                      "parallel.ep=3 does not divide num_experts=8");
  expect_layout_error(small_config({"parallel.ep=2"}), 3,
                      "parallel.ep=2 does not divide the 3 ranks");
  expect_layout_error(small_config({"parallel.pp=2"}), 3,
                      "parallel.pp=2 does not divide the 3 ranks");
  expect_layout_error(small_config({"parallel.pp=8"}), 8, "4 layers cannot fill");
  expect_layout_error(small_config(), 3, "do not split over dp=3");
  expect_layout_error(small_config({"parallel.pp=2", "parallel.schedule=\"interleaved-1f1b\"",
                                    "train.microbatches=1"}),
                      2, "multiple of parallel.pp");
  expect_layout_error(small_config({"parallel.pp=2", "model.tie_word_embeddings=true"}), 2,
                      "tie_word_embeddings=true");
  expect_layout_error(small_config({"parallel.zero=1", "parallel.overlap_grad_reduce=true"}), 1,
                      "overlap_grad_reduce needs parallel.zero=0");
}

TEST(PlanMemory, ZeroShardsTheMomentsOverDp) {
  const Plan replicated = make_plan(small_config(), 4, kNoRuntime);
  const Plan sharded = make_plan(small_config({"parallel.zero=1"}), 4, kNoRuntime);
  const RankMemory& r = replicated.stages[0];
  const RankMemory& s = sharded.stages[0];
  const double floats = static_cast<double>(r.dense_params + r.expert_params);
  EXPECT_DOUBLE_EQ(r.optimizer_state, 8.0 * floats);
  // Moments of a quarter plus the padded gradient shard: 3 x ceil(numel / 4) floats.
  const double shard = static_cast<double>((r.dense_params + 3) / 4 + (r.expert_params + 3) / 4);
  EXPECT_DOUBLE_EQ(s.optimizer_state, 12.0 * shard);
  EXPECT_GT(s.optimizer_scratch, 0.0);
  EXPECT_EQ(r.optimizer_scratch, 0.0);
  // Open MPI's copies: the whole payload of both in-flight all-reduces; under ZeRO-1, at the root
  // of the reduce-scatter's binomial tree, log2(4) = 2 copies of the larger padded send buffer,
  // alive with our own padded copy.
  EXPECT_DOUBLE_EQ(r.mpi_scratch, 4.0 * floats);
  const double expert_padded = 4.0 * 4.0 * static_cast<double>((r.expert_params + 3) / 4);
  const double dense_padded = 4.0 * 4.0 * static_cast<double>((r.dense_params + 3) / 4);
  EXPECT_DOUBLE_EQ(s.mpi_scratch, 2.0 * std::max(expert_padded, dense_padded));
  EXPECT_DOUBLE_EQ(s.reduction_peak, 3.0 * std::max(expert_padded, dense_padded));
  // Two ranks: one copy.
  const Plan two_ranks = make_plan(small_config({"parallel.zero=1"}), 2, kNoRuntime);
  const RankMemory& two = two_ranks.stages[0];
  EXPECT_DOUBLE_EQ(two.mpi_scratch, 4.0 * 2.0 *
                                        static_cast<double>(std::max((r.expert_params + 1) / 2,
                                                                     (r.dense_params + 1) / 2)));
  EXPECT_EQ(make_plan(small_config(), 1, kNoRuntime).stages[0].mpi_scratch, 0.0);
  EXPECT_DOUBLE_EQ(r.weights, s.weights);
}

// train.merge_steps (train/callbacks/model_merger.h): one fp32 sum of the tensors a rank writes
// per merge window alive at once. Windows of 3 updates before 4 and 6 share update 4, where the
// first is written and freed before the second takes its sum: one at a time; before 4 and 5 they
// share updates 3 and 4: two. Four data-parallel ranks each write about a quarter of the tensors.
TEST(PlanMemory, ModelMergeSumsOfTheWindowsAliveAtOnce) {
  auto merge = [](const char* steps, int64_t ranks) {
    return make_plan(small_config({std::string("train.merge_steps=") + steps,
                                   "train.merge_last_n_steps=3", "train.max_steps=10"}),
                     ranks, kNoRuntime)
        .stages[0];
  };
  const RankMemory plain = make_plan(small_config({"train.max_steps=10"}), 1, kNoRuntime).stages[0];
  EXPECT_EQ(plain.merge_sums, 0.0);
  const double whole = 4.0 * static_cast<double>(plain.dense_params + plain.expert_params);
  EXPECT_DOUBLE_EQ(merge("[4,6]", 1).merge_sums, whole);
  EXPECT_DOUBLE_EQ(merge("[4,5]", 1).merge_sums, 2.0 * whole);
  EXPECT_DOUBLE_EQ(merge("[4,5]", 1).peak, plain.peak + 2.0 * whole);
  const double quarter = merge("[4,6]", 4).merge_sums;
  EXPECT_GE(quarter, whole / 4.0);
  EXPECT_LT(quarter, whole / 2.0);
  // A run that evaluates (validation data, labelled sets or downstream tasks) evaluates the
  // averages too: every rank sums its whole model.
  for (const char* evaluator : {"train.downstream_tasks=[{path = \"x/t\"}]",
                                "data.lm_eval=[{label = \"c4\", paths = [\"x.npy\"]}]"}) {
    const RankMemory evaluated =
        make_plan(small_config({"train.merge_steps=[4,6]", "train.merge_last_n_steps=3",
                                "train.max_steps=10", evaluator}),
                  4, kNoRuntime)
            .stages[0];
    EXPECT_DOUBLE_EQ(evaluated.merge_sums, whole) << evaluator;
  }
}

// train.downstream_tasks (train/downstream_eval.h): the head computes logits only at the scored
// rows, in groups of at most the rows a training pass's head holds (a chunk's, or the
// micro-batch's), in the workspace within what the head's backward takes there; the scorer copies a
// group to the host: head rows x vocab floats, on top of the step's peak on the CPU, as host memory
// on an accelerator. Without tasks, nothing.
TEST(PlanMemory, DownstreamLogitsOfTheHeadsStage) {
  const std::string task = "train.downstream_tasks=[{path = \"x/t\"}]";
  auto stage = [](std::vector<std::string> sets, const Hardware& hardware) {
    return make_plan(small_config(std::move(sets)), 1, hardware).stages[0];
  };
  const RunConfig c = small_config({});
  const double tokens =
      static_cast<double>(c.train.batch_size / c.train.microbatches * c.train.seq_len);
  const double vocab = static_cast<double>(c.model.vocab_size);
  ASSERT_GT(tokens, 16.0);
  Hardware gpu = kNoRuntime;
  gpu.device = true;
  for (const Hardware& hardware : {kNoRuntime, gpu}) {
    const RankMemory chunked = stage({"train.lm_head_chunk_tokens=16"}, hardware);
    const RankMemory chunked_tasks = stage({"train.lm_head_chunk_tokens=16", task}, hardware);
    const RankMemory whole = stage({}, hardware);
    const RankMemory whole_tasks = stage({task}, hardware);
    EXPECT_EQ(chunked.downstream_logits, 0.0);
    EXPECT_EQ(whole.downstream_logits, 0.0);
    EXPECT_DOUBLE_EQ(chunked_tasks.downstream_logits, 4.0 * 16.0 * vocab);
    EXPECT_DOUBLE_EQ(whole_tasks.downstream_logits, 4.0 * tokens * vocab);
    if (hardware.device) {
      EXPECT_DOUBLE_EQ(whole_tasks.peak, whole.peak);
      EXPECT_DOUBLE_EQ(whole_tasks.host, whole.host + whole_tasks.downstream_logits);
      EXPECT_DOUBLE_EQ(whole_tasks.host, whole_tasks.batch_tokens + whole_tasks.downstream_logits);
    } else {
      EXPECT_DOUBLE_EQ(chunked_tasks.peak, chunked.peak + chunked_tasks.downstream_logits);
      EXPECT_DOUBLE_EQ(whole_tasks.peak, whole.peak + whole_tasks.downstream_logits);
      EXPECT_EQ(whole_tasks.host, 0.0);
    }
  }
}

// train.precision = "bf16": 2 bytes per GEMM weight element the rank's chunks multiply in bf16
// (model/bf16_weight_copies.h), counted by hand: attention (2 qs + 2 kvs) d = 3072 per layer, the
// dense layer's MLP 3 x 48 x 32 = 4608, a MoE layer's 4 local experts (ep 2) 4 x 3 x 16 x 32 = 6144
// plus its shared expert 3 x 24 x 32 = 2304 (the router stays fp32), the head 64 x 32 = 2048.
TEST(PlanMemory, Bf16WeightCopiesOfTheStagesModules) {
  const Plan plan = make_plan(
      small_config({"train.precision=\"bf16\"", "parallel.ep=2", "parallel.pp=2"}), 4, kNoRuntime);
  EXPECT_DOUBLE_EQ(plan.stages[0].bf16_weight_copies, 2.0 * (2 * 3072 + 4608 + 6144 + 2304));
  EXPECT_DOUBLE_EQ(plan.stages[1].bf16_weight_copies, 2.0 * (2 * 3072 + 2 * (6144 + 2304) + 2048));
  EXPECT_EQ(make_plan(small_config(), 1, kNoRuntime).stages[0].bf16_weight_copies, 0.0);
}

// train.precision = "mxfp8" (moe_intermediate_size and shared_expert_intermediate_size 32: whole
// MX blocks): the experts and the shared expert get MX caches in both orientations instead of
// bf16 copies, 2 (numel + numel / 32) bytes: a MoE layer's 4 local experts hold 4 x 3 x 32 x 32 =
// 12288 weights, its shared expert 3 x 32 x 32 = 3072; the rest keeps its bf16 copies. The
// experts' inputs x and act are kept as MXFP8 (1 + 1/32 bytes instead of 4) for each MoE layer,
// and one fp32 pair is lent per chunk: R = 2 rows x 16 x top-2 = 64 routed rows of d + H = 64
// values; the shared expert's SwiGLU output [32 tokens, 32] in fp32 (its MX GEMMs quantise it).
TEST(PlanMemory, MxWeightCachesAndMxExpertInputs) {
  const std::vector<std::string> layout = {"model.moe_intermediate_size=32",
                                           "model.shared_expert_intermediate_size=32",
                                           "parallel.ep=2", "parallel.pp=2"};
  auto with = [&](const char* precision) {
    std::vector<std::string> overrides = layout;
    overrides.push_back(std::string("train.precision=\"") + precision + "\"");
    return make_plan(small_config(overrides), 4, kNoRuntime);
  };
  const Plan mx = with("mxfp8"), bf16 = with("bf16");
  const double experts = 12288.0 + 3072.0, per_layer_cache = 2.0 * (experts + experts / 32.0);
  EXPECT_DOUBLE_EQ(mx.stages[0].mx_weight_caches, per_layer_cache);
  EXPECT_DOUBLE_EQ(mx.stages[1].mx_weight_caches, 2.0 * per_layer_cache);
  EXPECT_DOUBLE_EQ(mx.stages[0].bf16_weight_copies,
                   bf16.stages[0].bf16_weight_copies - 2 * experts);
  EXPECT_EQ(bf16.stages[0].mx_weight_caches, 0.0);
  // The experts' inputs (x and the SwiGLU output, 64 rows of 32 each) kept as bf16 roundings in
  // bf16, as MXFP8 copies in mxfp8; both lend fp32 x for the forward, mxfp8 the output too.
  const double inputs = 64.0 * (32 + 32);
  const double shared_act = 32.0 * 32;
  EXPECT_DOUBLE_EQ(
      bf16.stages[0].activations_per_microbatch.moe - mx.stages[0].activations_per_microbatch.moe,
      (2.0 - 33.0 / 32.0) * inputs - 2.0 * shared_act);
  EXPECT_DOUBLE_EQ(mx.stages[0].lent_expert_inputs, 4.0 * inputs);
  EXPECT_DOUBLE_EQ(bf16.stages[0].lent_expert_inputs, 4.0 * 64.0 * 32);
  // fp32 keeps them in fp32, and the shared expert's SwiGLU output too (bf16: bf16 bits,
  // kept_mlp_act_dtype).
  const Plan fp32 = with("fp32");
  EXPECT_DOUBLE_EQ(
      fp32.stages[0].activations_per_microbatch.moe - bf16.stages[0].activations_per_microbatch.moe,
      2.0 * inputs + 2.0 * shared_act);
  EXPECT_EQ(fp32.stages[0].lent_expert_inputs, 0.0);
  // The trainer's own error for widths that are not whole blocks.
  try {
    make_plan(small_config({"train.precision=\"mxfp8\""}), 1, kNoRuntime);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[mxfp8]"), std::string::npos) << e.what();
  }
}

// bf16 and mxfp8: the GEMM operand copies kept for the run (operand_copy_bytes), by hand for one
// rank's micro-batch of n = 4 x 16 = 64 tokens (d 32, q 32, kv 16, dense MLP 48, shared expert
// 32, experts 32 wide, R = 128 routed rows, vocabulary 64), 2 bytes a value: the attention's
// input [n, d] 4096; the largest output gradient rounded once, the LM head's logits gradient
// [n, 64] 8192 (the MLPs' SwiGLU gradients come in bf16); on the CPU the converted fp32 operands
// (the attention's context, the MLPs' and the head's inputs, all [n, 32], forward and weight
// gradient) 8192, the grouped GEMM's output gradients (bf16: [R, d] 8192; mxfp8: [R, 2H] 16384)
// and flash attention's q, k, v, dout [n, 96] 12288. fp32 keeps none; an accelerator only the
// first two. mxfp8's shared expert is an MX linear: linear.cpp's codes along the features, its
// widest operand [n, 2Hs] at 33/32 bytes a value, 4224; its bf16 weight gradients convert their
// fp32 operands, A up to [n, 2Hs] (4096 values) and B [n, d]: 4096 bytes more than the 8192.
TEST(PlanMemory, GemmOperandCopies) {
  auto plan = [](const char* precision, const Hardware& hardware) {
    return make_plan(
        small_config({"model.moe_intermediate_size=32", "model.shared_expert_intermediate_size=32",
                      std::string("train.precision=\"") + precision + "\""}),
        1, hardware);
  };
  const Hardware gpu{"test", 1e12, 0.0, "test", true, {}};
  const double slots = 4096 + 8192, cpu_common = 8192 + 12288;
  EXPECT_DOUBLE_EQ(plan("bf16", kNoRuntime).stages[0].operand_copies, slots + cpu_common + 8192);
  EXPECT_DOUBLE_EQ(plan("mxfp8", kNoRuntime).stages[0].operand_copies,
                   slots + cpu_common + 16384 + 33.0 / 32.0 * 4096 + 4096);
  EXPECT_DOUBLE_EQ(plan("bf16", gpu).stages[0].operand_copies, slots);
  EXPECT_EQ(plan("fp32", kNoRuntime).stages[0].operand_copies, 0.0);
  // mxfp8 with MX dense linears and MX expert weight gradients (dense MLP 64, shared expert 32, kv
  // 32: whole blocks): only the head and the attention core stay bf16. The head's logits gradient
  // 8192 and converted input 8192, flash attention's copies [n, 128] 16384, and linear.cpp's MX
  // scratch at its widest operands, 64 padded rows: codes along the features [64, 128] (the dense
  // gate/up's output gradient) and along the tokens of x [64 (in), 64], 33/32 bytes a value with
  // the scales, and the fp32 token-padded copy [64, 128]: 33/32 (8192 + 4096) + 4 x 8192. The
  // experts' MX weight gradients, over 16 rows each (padded to 32), need less.
  const Plan mx_all =
      make_plan(small_config({"model.moe_intermediate_size=32", "model.intermediate_size=64",
                              "model.shared_expert_intermediate_size=32",
                              "model.num_key_value_heads=4", "train.precision=\"mxfp8\"",
                              "train.mxfp8_dense=true", "train.mxfp8_expert_wgrad=true"}),
                1, kNoRuntime);
  EXPECT_DOUBLE_EQ(mx_all.stages[0].operand_copies,
                   8192 + 8192 + 16384 + 33.0 / 32.0 * (8192 + 4096) + 4.0 * 8192);
  // Part of the peak.
  const Plan bf16 = plan("bf16", kNoRuntime);
  const RankMemory& m = bf16.stages[0];
  EXPECT_DOUBLE_EQ(m.peak, m.weights + m.gradients + m.optimizer_state + m.bf16_weight_copies +
                               m.lent_expert_inputs + m.operand_copies + m.activations +
                               m.workspace + m.batch_tokens);
}

TEST(PlanMemory, LiveMicroBatchesComeFromTheSchedule) {
  // pp 2, 4 micro-batches: 1F1B keeps pp - stage alive, GPipe all of them.
  const Plan one_f =
      make_plan(small_config({"parallel.pp=2", "train.microbatches=4"}), 2, kNoRuntime);
  EXPECT_EQ(one_f.stages[0].peak_live_microbatches, 2);
  EXPECT_EQ(one_f.stages[1].peak_live_microbatches, 1);
  const Plan gpipe = make_plan(
      small_config({"parallel.pp=2", "train.microbatches=4", "parallel.schedule=\"gpipe\""}), 2,
      kNoRuntime);
  EXPECT_EQ(gpipe.stages[0].peak_live_microbatches, 4);
  EXPECT_EQ(gpipe.stages[1].peak_live_microbatches, 4);
  EXPECT_DOUBLE_EQ(gpipe.stages[0].activations,
                   4.0 * gpipe.stages[0].activations_per_microbatch.total());
  EXPECT_DOUBLE_EQ(one_f.stages[0].activations,
                   2.0 * one_f.stages[0].activations_per_microbatch.total());
  // Stage 0 holds the embedding and layers 0-1; stage 1 layers 2-3 and the head.
  // The lb terms only: lb_score_grad f32, route counts i64, probability sums f64 per layer and
  // expert, and each layer's z-loss mean.
  EXPECT_EQ(one_f.stages[0].activations_per_microbatch.head, (4.0 + 16.0) * 2 * 8 + 8.0 * 2);
  EXPECT_GT(one_f.stages[1].activations_per_microbatch.head, 4.0 * 2 * 16 * 64);  // the logits
}

// Every model chunk keeps its own workspace: an interleaved stage of two one-layer chunks holds
// both chunks' scratch, which a 1F1B pipeline of four one-layer stages shows one by one.
TEST(PlanMemory, EachChunkOfAnInterleavedStageKeepsItsWorkspace) {
  const Plan interleaved =
      make_plan(small_config({"parallel.pp=2", "parallel.schedule=\"interleaved-1f1b\"",
                              "parallel.virtual_stages=2", "train.microbatches=4"}),
                2, kNoRuntime);
  const Plan four =
      make_plan(small_config({"parallel.pp=4", "train.microbatches=4"}), 4, kNoRuntime);
  const RankMemory& stage0 = interleaved.stages[0];
  ASSERT_EQ(stage0.chunks, (std::vector<int64_t>{0, 2}));
  EXPECT_GT(four.stages[2].pass_scratch, 0.0);
  EXPECT_DOUBLE_EQ(stage0.workspace, four.stages[0].pass_scratch + four.stages[2].pass_scratch);
}

TEST(PlanMemory, AttentionActivationsGrowLinearlyWithSeq) {
  const ActivationBytes a16 =
      make_plan(small_config(), 1, kNoRuntime).stages[0].activations_per_microbatch;
  const ActivationBytes a32 = make_plan(small_config({"train.seq_len=32"}), 1, kNoRuntime)
                                  .stages[0]
                                  .activations_per_microbatch;
  // Flash attention keeps each query's logsumexp, no T x T probabilities: every term is linear
  // in the tokens, so twice the sequence is twice the bytes.
  EXPECT_DOUBLE_EQ(a32.attention, 2.0 * a16.attention);
  // 4 layers of fp32: q, k, v and the context (2 x 64 tokens x 32 + 2 x 64 x 16), the logsumexp
  // (4 rows x 4 heads x 16 positions), the full QK-norm's raw q, k and statistics.
  EXPECT_DOUBLE_EQ(a16.attention,
                   4.0 * 4 * (2 * 64 * 32 + 2 * 64 * 16 + 4 * 4 * 16 + 64 * 32 + 64 * 16 + 2 * 64));
}

TEST(PlanMemory, RowwiseCapacityIsCeilOfFactorTimesRoutes) {
  const Plan p = make_plan(small_config({"parallel.ep=2", "parallel.dispatch=\"rowwise\"",
                                         "parallel.capacity_factor=1.3"}),
                           2, kNoRuntime);
  // 4 rows per micro-batch over dp 2: 2 x 16 tokens x k 2 = 64 routes; ceil(1.3 x 64) = 84.
  EXPECT_EQ(p.stages[0].dispatch_capacity_rows, 84);
  EXPECT_DOUBLE_EQ(p.stages[0].dispatch_buffers, 2.0 * 4.0 * 84 * 32);
  EXPECT_EQ(make_plan(small_config({"parallel.ep=2"}), 2, kNoRuntime).stages[0].dispatch_buffers,
            0.0);
}

double bytes_of(const Plan& p, int64_t stage, const std::string& group, const std::string& op) {
  double total = 0.0;
  for (const CollectiveBytes& c : p.comms[static_cast<size_t>(stage)])
    if (c.group == group && c.op == op) total += c.bytes;
  return total;
}

// The symmetric transport moves the padded transport's blocks (the same traffic) and keeps one
// window of symmetric memory for the blocks that arrive: ep x block rows in 2 MiB granules.
TEST(PlanMemory, SymmetricTransportKeepsOneWindowOfThePaddedBlocks) {
  const std::vector<std::string> rowwise = {"train.device=\"cuda\"", "parallel.ep=2",
                                            "parallel.dispatch=\"rowwise\"",
                                            "parallel.capacity_factor=1.3"};
  std::vector<std::string> padded = rowwise, symmetric = rowwise;
  padded.push_back("parallel.rowwise_transport=\"padded\"");
  symmetric.push_back("parallel.rowwise_transport=\"symmetric\"");
  const Plan p = make_plan(small_config(padded), 2, kNoRuntime);
  const Plan s = make_plan(small_config(symmetric), 2, kNoRuntime);
  // 64 routes per rank; capacity ceil(1.3 x 64) = 84; blocks of min(84, 64) = 64 rows, 2 of them.
  EXPECT_EQ(s.stages[0].dispatch_capacity_rows, 128);
  EXPECT_DOUBLE_EQ(s.stages[0].dispatch_buffers, 2.0 * 1024 * 1024);  // 4 x 128 x 32, rounded up
  EXPECT_EQ(p.stages[0].dispatch_buffers, 0.0);
  EXPECT_GT(bytes_of(p, 0, "ep", "alltoall"), 0.0);
  EXPECT_DOUBLE_EQ(bytes_of(s, 0, "ep", "alltoall"), bytes_of(p, 0, "ep", "alltoall"));
  EXPECT_DOUBLE_EQ(s.stages[0].peak - p.stages[0].peak, 2.0 * 1024 * 1024);
}

TEST(PlanComm, GradientsAndWeights) {
  const Plan p = make_plan(small_config({"parallel.ep=2"}), 4, kNoRuntime);
  const RankMemory& m = p.stages[0];
  EXPECT_DOUBLE_EQ(bytes_of(p, 0, "dp", "allreduce"), 4.0 * static_cast<double>(m.dense_params));
  EXPECT_DOUBLE_EQ(bytes_of(p, 0, "ep_dp", "allreduce"),
                   4.0 * static_cast<double>(m.expert_params));
  const Plan z = make_plan(small_config({"parallel.zero=1"}), 4, kNoRuntime);
  const double shard = static_cast<double>((z.stages[0].dense_params + 3) / 4);
  EXPECT_DOUBLE_EQ(bytes_of(z, 0, "dp", "reduce_scatter"), 4.0 * 4.0 * shard);
  EXPECT_DOUBLE_EQ(bytes_of(z, 0, "dp", "allgather"), 4.0 * shard);
  EXPECT_EQ(bytes_of(make_plan(small_config(), 1, kNoRuntime), 0, "dp", "allreduce"), 0.0);
}

TEST(PlanComm, ExpertAndPipelineTraffic) {
  // ep 2 over 2 ranks: 3 MoE layers x 2 micro-batches x (2 rows x 16 tokens x k 2 x 1/2 remote)
  // rows of 32 floats, four times (rows out, outputs back, and the same in the backward).
  const Plan sync = make_plan(small_config({"parallel.ep=2"}), 2, kNoRuntime);
  const double one_way = 4.0 * 32.0 * 32.0 * 3.0 * 2.0;
  EXPECT_DOUBLE_EQ(bytes_of(sync, 0, "ep", "alltoallv"), 4.0 * one_way);
  const Plan rowwise =
      make_plan(small_config({"parallel.ep=2", "parallel.dispatch=\"rowwise\""}), 2, kNoRuntime);
  EXPECT_DOUBLE_EQ(bytes_of(rowwise, 0, "ep", "put"), 2.0 * one_way);
  EXPECT_DOUBLE_EQ(bytes_of(rowwise, 0, "ep", "get"), 2.0 * one_way);
  // pp 2: each stage sends one hidden state (or its gradient) per micro-batch: 8 rows x 16 x 32.
  const Plan pp = make_plan(small_config({"parallel.pp=2"}), 2, kNoRuntime);
  EXPECT_DOUBLE_EQ(bytes_of(pp, 0, "pp", "send"), 2.0 * 4.0 * 4 * 16 * 32);
  EXPECT_DOUBLE_EQ(bytes_of(pp, 1, "pp", "send"), 2.0 * 4.0 * 4 * 16 * 32);
}

TEST(PlanHardware, BuiltInsFilesAndErrors) {
  EXPECT_DOUBLE_EQ(load_hardware("H200").memory_bytes, 141e9);
  EXPECT_TRUE(load_hardware("h200").device);
  EXPECT_FALSE(load_hardware("cpu").device);
  EXPECT_GT(load_hardware("cpu").memory_bytes, 0.0);
  EXPECT_THROW(load_hardware("tpu-v9"), Error);
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("moecore_hw_" + std::to_string(getpid()) + ".json");
  std::ofstream(file) << R"({"name": "box", "memory_gib": 2, "runtime_overhead_mib": 10})";
  const Hardware h = load_hardware(file.string());
  EXPECT_EQ(h.name, "box");
  EXPECT_DOUBLE_EQ(h.memory_bytes, 2.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(h.runtime_bytes, 10.0 * 1024 * 1024);
  EXPECT_FALSE(h.rates.gemm_overlaps_memory);  // a host CPU unless "device" says otherwise
  std::ofstream(file) << R"({"name": "box"})";
  EXPECT_THROW(load_hardware(file.string()), Error);
  // Measured collective bus bandwidths, by buffer size (GB/s in the file).
  std::ofstream(file) << R"({"memory_gib": 2, "device": true, "collective_ranks": 4,
      "collective_bus_gbs": {"allreduce": [[1048576, 1.5], [67108864, 0.5]],
                             "allgather": [[1048576, 3]]}})";
  const Hardware bus = load_hardware(file.string());
  EXPECT_TRUE(bus.rates.gemm_overlaps_memory);
  EXPECT_EQ(bus.rates.collective_ranks, 4);
  EXPECT_DOUBLE_EQ(bus.rates.allreduce_bus.at(67108864.0), 0.5e9);
  EXPECT_DOUBLE_EQ(bus.rates.allgather_bus.at(1.0), 3e9);
  EXPECT_TRUE(bus.rates.reduce_scatter_bus.points.empty());
  for (const char* bad :
       {R"({"memory_gib": 2, "collective_bus_gbs": {"broadcast": [[1, 1]]}})",
        R"({"memory_gib": 2, "collective_bus_gbs": {"allreduce": []}})",
        R"({"memory_gib": 2, "collective_bus_gbs": {"allreduce": [[1, -1]]}})",
        R"({"memory_gib": 2, "collective_bus_gbs": {"allreduce": [[2, 1], [1, 1]]}})",
        R"({"memory_gib": 2, "collective_ranks": 1})"}) {
    std::ofstream(file) << bad;
    EXPECT_THROW(load_hardware(file.string()), Error) << bad;
  }
  std::filesystem::remove(file);
}

TEST(PlanMemory, AcceleratorsKeepTheWholeModelCopyOnTheHost) {
  const Plan cpu = make_plan(small_config(), 1, kNoRuntime);
  Hardware gpu = kNoRuntime;
  gpu.device = true;
  const Plan dev = make_plan(small_config(), 1, gpu);
  const RankMemory& c = cpu.stages[0];
  const RankMemory& g = dev.stages[0];
  EXPECT_EQ(c.host, 0.0);
  EXPECT_DOUBLE_EQ(g.host, c.batch_tokens);
  EXPECT_DOUBLE_EQ(g.peak, c.peak - g.host);
}

TEST(PlanReport, JsonCarriesEveryStage) {
  const Plan p = make_plan(small_config({"parallel.pp=2"}), 4, kNoRuntime);
  const nlohmann::json j = plan_json(p);
  EXPECT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["layout"]["dp"], 2);
  EXPECT_EQ(j["parameters"]["total"], p.params.total);
  EXPECT_DOUBLE_EQ(j["peak_bytes_per_rank"].get<double>(), p.peak_bytes());
  EXPECT_NE(plan_text(p).find("stage 1"), std::string::npos);
}

}  // namespace
}  // namespace moecore::plan
