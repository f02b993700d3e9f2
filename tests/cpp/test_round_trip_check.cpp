// The self-check of `import` and `train --init-from` (train/round_trip_check.h) on a tiny model: a
// model directory checks against the model that wrote it with max |diff| 0, and fails, in one
// line naming the directory, against one weight rounded on the way, against another
// architecture, and for weights whose logits are not finite.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <limits>
#include <string>

#include "core/check.h"
#include "io/hf_config.h"
#include "scratch_dir.h"
#include "train/round_trip_check.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

ModelConfig round_trip_model() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.intermediate_size = 12;
  c.first_k_dense_replace = 1;
  return c;
}

class RoundTripCheckTest : public ::testing::Test {
 protected:
  RoundTripCheckTest() : layout_(ParamLayout::build(round_trip_model())), params_(layout_) {}

  void SetUp() override {
    run_.model = round_trip_model();
    init_params(layout_, 99, params_);
  }

  void write(const RunConfig& run) {
    write_model_dir(dir_, layout_, params_,
                    {&run, io::hf_config_json(run_.model, 64, 0), {}, {}, {}});
  }
  // check_model_dir's one-line error, or "" when the check passes.
  std::string check_error(const ParamBuffers& params) {
    try {
      check_model_dir(dir_, dir_, run_.model, layout_, params, "[test]");
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_NE(message.find("[test] self-check: "), std::string::npos) << message;
      return message;
    }
    return "";
  }

  ParamLayout layout_;
  ParamBuffers params_;
  RunConfig run_;
  ScratchDir scratch_{"moecore_round_trip"};
  const std::string dir_ = scratch_.path().string();
};

TEST_F(RoundTripCheckTest, PassesOnTheModelThatWroteTheDirectory) {
  write(run_);
  const RoundTripCheck check = check_model_dir(dir_, dir_, run_.model, layout_, params_, "[test]");
  EXPECT_EQ(check.batch, 2);
  EXPECT_EQ(check.seq, 32);
  EXPECT_EQ(check.max_abs_diff, 0.0);
  EXPECT_GT(check.max_abs_logit, 0.0);
}

// A reader or writer that passed a tensor through bf16 would move its elements by up to 2^-9
// relative; one element of the LM head (read by a logit of every token) moved by 2^-10 fails.
TEST_F(RoundTripCheckTest, OneWeightRoundedOnTheWayFails) {
  write(run_);
  ParamBuffers other = params_;
  const ParamSpec* head = layout_.find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  other.at(*head)[5] *= 1.0f + 1.0f / 1024.0f;
  const std::string error = check_error(other);
  EXPECT_NE(error.find("differ"), std::string::npos) << error;
  EXPECT_NE(error.find(dir_), std::string::npos) << error;
}

TEST_F(RoundTripCheckTest, AnotherArchitectureInConfigTomlFails) {
  RunConfig other = run_;
  other.model.rope_theta = run_.model.rope_theta * 2.0;
  write(other);
  const std::string error = check_error(params_);
  EXPECT_NE(error.find("config.toml reads back as another model"), std::string::npos) << error;
  EXPECT_NE(error.find("rope_theta"), std::string::npos) << error;
}

TEST_F(RoundTripCheckTest, NonFiniteLogitsFail) {
  const ParamSpec* norm = layout_.find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  params_.at(*norm)[0] = std::numeric_limits<float>::infinity();
  write(run_);
  const std::string error = check_error(params_);
  EXPECT_NE(error.find("not finite"), std::string::npos) << error;
}

}  // namespace
}  // namespace moecore
