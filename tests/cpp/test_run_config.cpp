// Run configuration: a TOML file with every key, --set overrides, the errors for unknown keys,
// tables and inconsistent values, the TOML round trip, and model_config_difference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "train/run_config.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

const char* const kFull = R"(
[model]
vocab_size = 300
hidden_size = 48
num_hidden_layers = 3
num_attention_heads = 6
num_key_value_heads = 2
head_dim = 10
rope_theta = 500000.0
rms_norm_eps = 1e-6
tie_word_embeddings = true
num_experts = 16
num_experts_per_tok = 4
moe_intermediate_size = 24
intermediate_size = 96
first_k_dense_replace = 1
shared_expert_intermediate_size = 32
norm_topk_prob = true
router_aux_loss_coef = 0.02
router_z_loss_coef = 0.001
qk_norm = "per_head"
router_score = "sigmoid"
lb_loss_style = "hf"

[optim]
lr = 3e-4
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
weight_decay = 0.05
max_grad_norm = 0.5
warmup_steps = 25
schedule = "linear"
min_lr_ratio = 0.2

[train]
seed = 17
max_steps = 500
batch_size = 12
microbatches = 3
seq_len = 64
threads = 4
precision = "bf16"
log_every = 5
eval_every = 50
eval_batches = 2
save_every = 100
keep_last = 5
max_seconds = 3600
skip_sigma = 4.5
skip_window = 64
skip_min_window = 10
gerrymander_window = 40
gerrymander_threshold = 0.1
sample_prompt = "Once upon"
sample_tokens = 20
out_dir = "runs/full"

[data]
train = ["a.npy", "dir/b"]
val = "val.npy"
tokenizer = "tok/tokenizer.json"
label_mask = ["a.mask", "dir/m"]
val_label_mask = "val.mask"
instance_filter = true
repetition_max_period = 9
repetition_min_period = 2
repetition_max_count = 7
)";

RunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_run_config(text, "test.toml", overrides);
}

// The message of the Error that parsing throws ("" when it does not throw).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, ParsesEveryKey) {
  const RunConfig c = parse(kFull);
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.vocab_size, 300);
  EXPECT_EQ(m.hidden_size, 48);
  EXPECT_EQ(m.num_hidden_layers, 3);
  EXPECT_EQ(m.num_attention_heads, 6);
  EXPECT_EQ(m.num_key_value_heads, 2);
  EXPECT_EQ(m.head_dim, 10);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rms_norm_eps, 1e-6);
  EXPECT_TRUE(m.tie_word_embeddings);
  EXPECT_EQ(m.num_experts, 16);
  EXPECT_EQ(m.num_experts_per_tok, 4);
  EXPECT_EQ(m.moe_intermediate_size, 24);
  EXPECT_EQ(m.intermediate_size, 96);
  EXPECT_EQ(m.first_k_dense_replace, 1);
  EXPECT_EQ(m.shared_expert_intermediate_size, 32);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.router_aux_loss_coef, 0.02);
  EXPECT_EQ(m.router_z_loss_coef, 0.001);
  EXPECT_EQ(m.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(m.router_score, RouterScore::kSigmoid);
  EXPECT_EQ(m.lb_loss_style, LbLossStyle::kHf);

  const OptimConfig& o = c.optim;
  EXPECT_EQ(o.lr, 3e-4);
  EXPECT_EQ(o.beta1, 0.8);
  EXPECT_EQ(o.beta2, 0.99);
  EXPECT_EQ(o.eps, 1e-10);
  EXPECT_EQ(o.weight_decay, 0.05);
  EXPECT_EQ(o.max_grad_norm, 0.5);
  EXPECT_EQ(o.warmup_steps, 25);
  EXPECT_EQ(o.schedule, LrSchedule::kLinear);
  EXPECT_EQ(o.min_lr_ratio, 0.2);
  EXPECT_EQ(o.decay_min_lr_ratio, 0.0);
  EXPECT_EQ(o.power_exponent, -0.51);

  const TrainConfig& t = c.train;
  EXPECT_EQ(t.seed, 17u);
  EXPECT_EQ(t.max_steps, 500);
  EXPECT_EQ(t.batch_size, 12);
  EXPECT_EQ(t.microbatches, 3);
  EXPECT_EQ(t.seq_len, 64);
  EXPECT_EQ(t.threads, 4);
  EXPECT_EQ(t.precision, TrainPrecision::kBf16);
  EXPECT_EQ(t.log_every, 5);
  EXPECT_EQ(t.eval_every, 50);
  EXPECT_EQ(t.eval_batches, 2);
  EXPECT_EQ(t.save_every, 100);
  EXPECT_EQ(t.keep_last, 5);
  EXPECT_EQ(t.max_seconds, 3600.0);  // an integer is accepted for a float key
  EXPECT_EQ(t.skip_sigma, 4.5);
  EXPECT_EQ(t.skip_window, 64);
  EXPECT_EQ(t.skip_min_window, 10);
  EXPECT_EQ(t.gerrymander_window, 40);
  EXPECT_EQ(t.gerrymander_threshold, 0.1);
  EXPECT_EQ(t.sample_prompt, "Once upon");
  EXPECT_EQ(t.sample_tokens, 20);
  EXPECT_EQ(t.out_dir, "runs/full");

  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.npy", "dir/b"}));
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"val.npy"}));  // one string: a list of one
  EXPECT_EQ(c.data.tokenizer, "tok/tokenizer.json");
  EXPECT_EQ(c.data.label_mask, (std::vector<std::string>{"a.mask", "dir/m"}));
  EXPECT_EQ(c.data.val_label_mask, (std::vector<std::string>{"val.mask"}));
  EXPECT_TRUE(c.data.instance_filter);
  EXPECT_EQ(c.data.repetition.max_period, 9);
  EXPECT_EQ(c.data.repetition.min_period, 2);
  EXPECT_EQ(c.data.repetition.max_count, 7);
}

TEST(RunConfig, EmptyTextGivesDefaults) {
  const RunConfig c = parse("");
  const RunConfig d;
  EXPECT_EQ(run_config_to_toml(c), run_config_to_toml(d));
  EXPECT_EQ(model_config_difference(c.model, d.model), "");
}

TEST(RunConfig, Overrides) {
  const RunConfig c =
      parse(kFull, {"train.max_steps=50", "optim.lr=1e-2", "train.max_seconds=2.5",
                    "model.tie_word_embeddings=false", "train.out_dir=\"runs/quoted\"",
                    "data.train=[\"x.npy\",\"y.npy\"]", "train.sample_prompt=hello",
                    "data.tokenizer=other/tok.json", "optim.schedule=constant"});
  EXPECT_EQ(c.train.max_steps, 50);
  EXPECT_EQ(c.optim.lr, 1e-2);
  EXPECT_EQ(c.train.max_seconds, 2.5);
  EXPECT_FALSE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.train.out_dir, "runs/quoted");
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"x.npy", "y.npy"}));
  EXPECT_EQ(c.train.sample_prompt, "hello");      // a bare word is a string
  EXPECT_EQ(c.data.tokenizer, "other/tok.json");  // so is an unquoted path
  EXPECT_EQ(c.optim.schedule, LrSchedule::kConstant);
  EXPECT_EQ(c.train.batch_size, 12);  // untouched keys keep the file's values

  // An override may create a table the file does not have, and later overrides win.
  const RunConfig d = parse("", {"train.seed=5", "train.seed=6"});
  EXPECT_EQ(d.train.seed, 6u);

  // Overrides are type-checked and key-checked like the file.
  EXPECT_NE(error_of(kFull, {"train.max_steps=many"}).find("train.max_steps must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(kFull, {"train.max_step=5"}).find("unknown key train.max_step"),
            std::string::npos);
  EXPECT_NE(error_of(kFull, {"trainmax_steps=5"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(error_of(kFull, {"train.max_steps"}).find("section.key=value"), std::string::npos);
}

TEST(RunConfig, UnknownKeysAndTablesAreErrors) {
  std::string e = error_of("[model]\nhiden_size = 64\n");
  EXPECT_NE(e.find("unknown key model.hiden_size"), std::string::npos) << e;
  e = error_of("[trainer]\nmax_steps = 1\n");
  EXPECT_NE(e.find("unknown table [trainer]"), std::string::npos) << e;
  e = error_of("max_steps = 1\n");
  EXPECT_NE(e.find("must be a table"), std::string::npos) << e;
  e = error_of("[model]\nhidden_size = \"64\"\n");
  EXPECT_NE(e.find("model.hidden_size must be an integer"), std::string::npos) << e;
  e = error_of("[model]\nqk_norm = \"half\"\n");
  EXPECT_NE(e.find("qk_norm=\"half\" is not one of"), std::string::npos) << e;
  e = error_of("[train]\nprecision = \"fp16\"\n");
  EXPECT_NE(e.find("train.precision=\"fp16\" is not one of \"fp32\", \"bf16\""), std::string::npos)
      << e;
  e = error_of("[data]\ntrain = [1, 2]\n");
  EXPECT_NE(e.find("data.train must be a list of strings"), std::string::npos) << e;
  e = error_of("[model\n");
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
}

// The initialisation keys: read, round-tripped, bad values refused.
TEST(RunConfig, InitMethodKeys) {
  const RunConfig c =
      parse("[train]\ninit_method = \"llama_depth\"\ninit_std = 0.03\nembedding_init_std = 0.5\n");
  EXPECT_EQ(c.train.init.method, InitMethod::kLlamaDepth);
  EXPECT_EQ(c.train.init.std, 0.03);
  EXPECT_EQ(c.train.init.embedding_std, 0.5);
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(reparsed.train.init.method, InitMethod::kLlamaDepth);
  EXPECT_EQ(reparsed.train.init.std, 0.03);
  EXPECT_EQ(reparsed.train.init.embedding_std, 0.5);
  EXPECT_EQ(RunConfig{}.train.init.method, InitMethod::kMoecore);
  EXPECT_NE(error_of("[train]\ninit_std = -0.02\n").find("train.init_std=-0.02 must be"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nembedding_init_std = 0.0\n").find("train.embedding_init_std=0"),
            std::string::npos);
}

// Issue 12's [model] keys: read, round-tripped, and each bad value a one-line error naming it.
TEST(RunConfig, BlockNormNormaliserAndRouterOptions) {
  const RunConfig c = parse(
      "[model]\nblock_norm = \"reordered\"\nloss_normalizer = \"labels\"\n"
      "router_score = \"topk_softmax\"\nnum_experts = 16\nnum_experts_per_tok = 4\n"
      "n_group = 4\ntopk_group = 2\nrouted_scaling_factor = 2.5\n"
      "router_bias_update_rate = 0.001\nlb_loss_scope = \"rank\"\n"
      "lb_loss_granularity = \"instance\"\n[data]\norder = \"olmo-core\"\n");
  EXPECT_EQ(c.model.block_norm, BlockNorm::kReordered);
  EXPECT_EQ(c.model.lb_loss_scope, LbLossScope::kRank);
  EXPECT_EQ(c.model.lb_loss_granularity, LbLossGranularity::kInstance);
  EXPECT_EQ(c.data.order, data::OrderRule::kOlmoCore);
  EXPECT_EQ(c.model.loss_normalizer, LossNormalizer::kLabels);
  EXPECT_EQ(c.model.router_score, RouterScore::kTopkSoftmax);
  EXPECT_EQ(c.model.n_group, 4);
  EXPECT_EQ(c.model.topk_group, 2);
  EXPECT_EQ(c.model.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.model.router_bias_update_rate, 0.001);
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(model_config_difference(c.model, reparsed.model), "");
  EXPECT_EQ(reparsed.model.lb_loss_scope, LbLossScope::kRank);
  EXPECT_EQ(reparsed.model.lb_loss_granularity, LbLossGranularity::kInstance);
  EXPECT_EQ(reparsed.data.order, data::OrderRule::kOlmoCore);
  EXPECT_NE(model_config_difference(c.model, RunConfig{}.model), "");
  // Defaults: pre-norm, tokens, no groups, no scale, no bias.
  const ModelConfig d;
  EXPECT_EQ(d.block_norm, BlockNorm::kPre);
  EXPECT_EQ(d.loss_normalizer, LossNormalizer::kTokens);
  EXPECT_EQ(d.n_group, 1);
  EXPECT_EQ(d.routed_scaling_factor, 1.0);
  EXPECT_FALSE(d.has_router_bias());
  EXPECT_EQ(d.lb_loss_granularity, LbLossGranularity::kLocalBatch);

  std::string e = error_of("[model]\nblock_norm = \"post\"\n");
  EXPECT_NE(e.find("model.block_norm=\"post\" is not one of \"pre\", \"reordered\""),
            std::string::npos)
      << e;
  e = error_of("[model]\nlb_loss_granularity = \"sequence\"\n");
  EXPECT_NE(e.find("model.lb_loss_granularity=\"sequence\" is not one of \"local_batch\", "
                   "\"instance\""),
            std::string::npos)
      << e;
  e = error_of("[model]\nloss_normalizer = \"batch\"\n");
  EXPECT_NE(e.find("model.loss_normalizer=\"batch\""), std::string::npos) << e;
  e = error_of("[model]\nnum_experts = 8\nn_group = 3\ntopk_group = 1\n");
  EXPECT_NE(e.find("model.n_group=3 does not divide num_experts=8"), std::string::npos) << e;
  e = error_of("[model]\nnum_experts = 8\nn_group = 4\ntopk_group = 5\n");
  EXPECT_NE(e.find("model.topk_group=5 must be in [1, n_group=4]"), std::string::npos) << e;
  e = error_of("[model]\nnum_experts = 8\nnum_experts_per_tok = 3\nn_group = 4\n");
  EXPECT_NE(e.find("num_experts_per_tok=3 exceeds the 2 experts of topk_group=1"),
            std::string::npos)
      << e;
  e = error_of("[model]\nrouted_scaling_factor = 0\n");
  EXPECT_NE(e.find("model.routed_scaling_factor=0 must be positive"), std::string::npos) << e;
  e = error_of("[model]\nrouter_bias_update_rate = -1e-3\n");
  EXPECT_NE(e.find("model.router_bias_update_rate=-0.001 must be >= 0"), std::string::npos) << e;
  e = error_of("[model]\nrouter_bias_update_rate = 1e-3\nrouting = \"random\"\n");
  EXPECT_NE(e.find("need model.routing=\"learned\""), std::string::npos) << e;
  e = error_of("[model]\nloss_normalizer = \"labels\"\nlb_loss_style = \"hf\"\n");
  EXPECT_NE(e.find("needs model.lb_loss_style=\"olmo-core\""), std::string::npos) << e;
}

TEST(RunConfig, MicrobatchesMustDivideBatchSize) {
  std::string e = error_of("[train]\nbatch_size = 12\nmicrobatches = 5\n");
  EXPECT_NE(e.find("microbatches=5"), std::string::npos) << e;
  EXPECT_NE(error_of("[train]\nbatch_size = 12\nmicrobatches = 0\n").find("microbatches"),
            std::string::npos);
  EXPECT_EQ(error_of("[train]\nbatch_size = 12\nmicrobatches = 4\n"), "");
}

TEST(RunConfig, EvalBatchesZeroNeedsEvalEveryZero) {
  std::string e = error_of("[train]\neval_every = 10\neval_batches = 0\n");
  EXPECT_NE(e.find("eval_batches=0"), std::string::npos) << e;
  EXPECT_EQ(error_of("[train]\neval_every = 0\neval_batches = 0\n"), "");  // the whole set
  e = error_of("[train]\neval_every = 0\neval_batches = -3\n");
  EXPECT_NE(e.find("train.eval_batches=-3 must be >= 0"), std::string::npos) << e;
}

TEST(RunConfig, TomlRoundTrip) {
  for (const RunConfig& original : {parse(kFull), RunConfig{}}) {
    const std::string text = run_config_to_toml(original);
    const RunConfig reparsed = parse(text);
    EXPECT_EQ(run_config_to_toml(reparsed), text);
    EXPECT_EQ(model_config_difference(original.model, reparsed.model), "");
  }
  // Special characters in strings survive.
  RunConfig c;
  c.train.sample_prompt = "say \"hi\"\n\ttab \\ back";
  c.data.val = {"a b.npy", "ü.npy"};
  c.train.precision = TrainPrecision::kBf16;
  c.optim.schedule = LrSchedule::kCosineLinearDecay;
  c.optim.decay_min_lr_ratio = 0.05;
  c.optim.power_exponent = -0.3;
  c.optim.units = LrUnits::kTokens;
  c.optim.warmup_steps = 0;
  c.optim.warmup_tokens = 4096;
  c.optim.decay_tokens = 2048;
  c.optim.t_max_tokens = 8192;
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(reparsed.optim.t_max_tokens, 8192);
  EXPECT_EQ(reparsed.optim.units, LrUnits::kTokens);
  EXPECT_EQ(reparsed.optim.warmup_tokens, 4096);
  EXPECT_EQ(reparsed.optim.decay_tokens, 2048);
  EXPECT_EQ(reparsed.train.precision, TrainPrecision::kBf16);
  EXPECT_EQ(reparsed.optim.schedule, LrSchedule::kCosineLinearDecay);
  EXPECT_EQ(reparsed.optim.decay_min_lr_ratio, 0.05);
  EXPECT_EQ(reparsed.optim.power_exponent, -0.3);
  for (const auto& [text, schedule] :
       {std::pair{"schedule = \"half_cos\"\n", LrSchedule::kHalfCosine},
        std::pair{"schedule = \"power\"\nwarmup_steps = 2\n", LrSchedule::kPower},
        std::pair{"schedule = \"exponential\"\n", LrSchedule::kExponential}})
    EXPECT_EQ(parse(run_config_to_toml(parse(std::string("[optim]\n") + text))).optim.schedule,
              schedule)
        << text;
  EXPECT_EQ(reparsed.train.sample_prompt, c.train.sample_prompt);
  EXPECT_EQ(reparsed.data.val, c.data.val);
  EXPECT_EQ(run_config_to_toml(reparsed), run_config_to_toml(c));
}

// [[data.lm_eval]] (OLMo-core's LM evaluator's labelled sets) with their cadence: read, checked,
// written back (as config.toml and every checkpoint hold them) and read again the same.
TEST(RunConfig, LmEvalSetsRoundTrip) {
  const RunConfig c = parse(
      "[train]\neval_every = 5\nlm_eval_every = 10\nlm_eval_batches = 3\n"
      "[[data.lm_eval]]\nlabel = \"c4\"\npaths = [\"a.npy\", \"b.npy\"]\n"
      "[[data.lm_eval]]\nlabel = \"sft\"\npaths = [\"s\"]\nlabel_mask = [\"m\"]\n");
  ASSERT_EQ(c.data.lm_eval.size(), 2u);
  EXPECT_EQ(c.data.lm_eval[0].label, "c4");
  EXPECT_EQ(c.data.lm_eval[0].paths, (std::vector<std::string>{"a.npy", "b.npy"}));
  EXPECT_TRUE(c.data.lm_eval[0].label_mask.empty());
  EXPECT_EQ(c.data.lm_eval[1].label_mask, (std::vector<std::string>{"m"}));
  EXPECT_EQ(c.train.lm_eval_every, 10);
  EXPECT_EQ(c.train.lm_eval_batches, 3);
  const std::string text = run_config_to_toml(c);
  const RunConfig again = parse(text);
  EXPECT_EQ(run_config_to_toml(again), text);
  ASSERT_EQ(again.data.lm_eval.size(), 2u);
  EXPECT_EQ(again.data.lm_eval[1].paths, c.data.lm_eval[1].paths);
  EXPECT_EQ(again.data.lm_eval[1].label_mask, c.data.lm_eval[1].label_mask);
  EXPECT_EQ(again.train.lm_eval_every, 10);
  EXPECT_EQ(again.train.lm_eval_batches, 3);
  // Written only when there are any.
  EXPECT_EQ(run_config_to_toml(RunConfig{}).find("lm_eval]"), std::string::npos);
}

// train.max_tokens (OLMo-core's max_duration in tokens) sets max_steps to the updates until the
// tokens are reached, is written back instead of max_steps, and is exclusive with it.
TEST(RunConfig, MaxTokensGivesTheUpdates) {
  const std::string text = "[train]\nmax_tokens = 600\nbatch_size = 2\nseq_len = 32\n";
  const RunConfig c = parse(text);
  EXPECT_EQ(c.train.max_tokens, 600);
  EXPECT_EQ(c.train.max_steps, 10);  // ceil(600 / 64): the 10th ends at 640
  EXPECT_EQ(parse(text, {"train.max_tokens=640"}).train.max_steps, 10);
  EXPECT_EQ(parse(text, {"train.max_tokens=641"}).train.max_steps, 11);
  const std::string toml = run_config_to_toml(c);
  EXPECT_NE(toml.find("max_tokens = 600"), std::string::npos) << toml;
  EXPECT_EQ(toml.find("\nmax_steps"), std::string::npos) << toml;
  EXPECT_EQ(run_config_to_toml(parse(toml)), toml);
  // From a resume's origin (5 updates, 320 tokens) in updates of 128: 3 more; none past the end.
  TrainConfig t = c.train;
  t.batch_size = 4;
  EXPECT_EQ(max_steps_for_tokens(t, {5, 320}), 8);
  EXPECT_EQ(max_steps_for_tokens(t, {12, 700}), 12);
  t.max_tokens = 0;
  EXPECT_EQ(max_steps_for_tokens(t, {5, 320}), t.max_steps);
  t.max_tokens = std::numeric_limits<int64_t>::max();
  t.batch_size = 1;
  t.seq_len = 2;
  EXPECT_EQ(max_steps_for_tokens(t), std::numeric_limits<int64_t>::max() / 2 + 1);
  EXPECT_NE(error_of(text + "max_steps = 5\n")
                .find("train.max_steps=5 and train.max_tokens=600 both set"),
            std::string::npos);
  EXPECT_NE(error_of(text, {"train.max_tokens=-1"}).find("train.max_tokens=-1 must be >= 0"),
            std::string::npos);
  EXPECT_EQ(parse(text, {"train.max_tokens=0", "train.max_steps=5"}).train.max_steps, 5);
}

// train.max_epochs (OLMo-core's Duration.epochs): its updates are known once the training set is
// read (train/training_data.h), so max_steps is 0 until then and the length is written as given;
// one length of the three.
TEST(RunConfig, MaxEpochsIsTheLengthAsGiven) {
  const std::string text = "[train]\nmax_epochs = 3\nbatch_size = 2\nseq_len = 32\n";
  const RunConfig c = parse(text);
  EXPECT_EQ(c.train.max_epochs, 3);
  EXPECT_EQ(c.train.max_steps, 0);
  const std::string toml = run_config_to_toml(c);
  EXPECT_NE(toml.find("max_epochs = 3"), std::string::npos) << toml;
  EXPECT_EQ(toml.find("\nmax_steps"), std::string::npos) << toml;
  EXPECT_EQ(run_config_to_toml(parse(toml)), toml);
  EXPECT_NE(
      error_of(text + "max_steps = 5\n").find("train.max_steps=5 and train.max_epochs=3 both set"),
      std::string::npos);
  EXPECT_NE(error_of(text + "max_tokens = 64\n")
                .find("train.max_tokens=64 and train.max_epochs=3 both set"),
            std::string::npos);
  EXPECT_NE(error_of(text, {"train.max_epochs=-2"}).find("train.max_epochs=-2 must be >= 0"),
            std::string::npos);
  EXPECT_EQ(parse(text, {"train.max_epochs=0", "train.max_steps=5"}).train.max_steps, 5);
}

// A hard stop (OLMo-core's Trainer.hard_stop) ends the loop before max_steps without changing it:
// in tokens at the update whose tokens seen reach it, counted from the current batch's origin.
TEST(RunConfig, HardStopEndsTheLoopNotTheSchedule) {
  const RunConfig c = parse("[train]\nmax_steps = 10\nbatch_size = 2\nseq_len = 32\n",
                            {"train.hard_stop_tokens=300"});
  EXPECT_EQ(c.train.max_steps, 10);
  EXPECT_EQ(last_step(c.train, {}), 5);  // 5 x 64 = 320 >= 300
  EXPECT_EQ(last_step(c.train, {4, 256}), 5);
  EXPECT_EQ(last_step(c.train, {2, 280}), 3);  // after another batch: 280 + 64 >= 300
  TrainConfig t = c.train;
  t.hard_stop_tokens = 0;
  t.hard_stop_steps = 4;
  EXPECT_EQ(last_step(t, {}), 4);
  t.hard_stop_steps = 40;
  EXPECT_EQ(last_step(t, {}), 10);  // past the run's end: the end
  EXPECT_NE(
      error_of("[train]\nhard_stop_steps = 3\nhard_stop_tokens = 100\n").find("give at most one"),
      std::string::npos);
  const std::string toml = run_config_to_toml(c);
  EXPECT_EQ(run_config_to_toml(parse(toml)), toml);
  EXPECT_NE(toml.find("hard_stop_tokens = 300"), std::string::npos);
}

// A --set of a length replaces the file's (`--set train.max_tokens=N` on a config that gives
// max_steps, as configs/default.toml does); two lengths set by --set are refused; a --set of 0
// unsets max_tokens or max_epochs only. Lengths whose tokens overflow are one-line errors (both
// near 2^62: no signed overflow in the check either).
TEST(RunConfig, LengthOverridesReplaceTheFilesLength) {
  const std::string steps = "[train]\nmax_steps = 400\nbatch_size = 2\nseq_len = 32\n";
  EXPECT_EQ(parse(steps, {"train.max_tokens=600"}).train.max_steps, 10);
  EXPECT_EQ(parse(steps, {"train.max_epochs=2"}).train.max_epochs, 2);
  EXPECT_EQ(parse(steps, {"train.max_tokens=0"}).train.max_steps, 400);
  const std::string tokens = "[train]\nmax_tokens = 600\nbatch_size = 2\nseq_len = 32\n";
  EXPECT_EQ(parse(tokens, {"train.max_steps=5"}).train.max_steps, 5);
  EXPECT_EQ(parse(tokens, {"train.max_steps=5"}).train.max_tokens, 0);
  EXPECT_NE(error_of(steps, {"train.max_tokens=600", "train.max_epochs=2"})
                .find("--set train.max_tokens and --set train.max_epochs"),
            std::string::npos);
  EXPECT_NE(error_of(tokens, {"train.max_tokens=9223372036854775807"})
                .find("train.max_tokens=9223372036854775807 in updates of 64 tokens"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmax_tokens = 4611686018427387904\n"
                     "max_epochs = 4611686018427387904\n")
                .find("both set"),
            std::string::npos);
}

// The stages and the override decay of "composable" survive a checkpoint's config with the keys
// they were given (an absolute rate stays one, a fraction a fraction).
TEST(RunConfig, ComposableStagesRoundTrip) {
  const RunConfig c = parse(
      "[optim]\nschedule = \"composable\"\nwarmup_steps = 0\n"
      "[[optim.stages]]\nduration = 10\nstart_lr_fraction = 0.0\nend_lr_fraction = 1\n"
      "[[optim.stages]]\nduration = 90\nshape = \"cosine\"\nend_lr = 1e-4\n"
      "[optim.override_decay]\nstart = 60\nduration = 20\nend_lr_fraction = 0.0\n");
  ASSERT_EQ(c.optim.stages.size(), 2u);
  EXPECT_EQ(c.optim.stages[0].duration, 10);
  EXPECT_EQ(c.optim.stages[0].start_lr_fraction, 0.0);
  EXPECT_FALSE(c.optim.stages[0].start_lr.has_value());
  EXPECT_EQ(c.optim.stages[0].end_lr_fraction, 1.0);
  EXPECT_EQ(c.optim.stages[1].shape, LrShape::kCosine);
  EXPECT_EQ(c.optim.stages[1].end_lr, 1e-4);
  ASSERT_TRUE(c.optim.override_decay.has_value());
  EXPECT_EQ(c.optim.override_decay->start, 60);
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(reparsed.optim.stages, c.optim.stages);
  EXPECT_EQ(reparsed.optim.override_decay, c.optim.override_decay);
  EXPECT_EQ(run_config_to_toml(reparsed), run_config_to_toml(c));
  // A rate is a number; a stage a table.
  std::string e = error_of(
      "[optim]\nschedule = \"composable\"\nwarmup_steps = 0\n"
      "[[optim.stages]]\nduration = 10\nend_lr = \"low\"\n");
  EXPECT_NE(e.find("optim.stages[0].end_lr must be a number"), std::string::npos) << e;
  e = error_of("[optim]\nschedule = \"composable\"\nwarmup_steps = 0\nstages = [1, 2]\n");
  EXPECT_NE(e.find("optim.stages must be an array of tables"), std::string::npos) << e;
}

// The lists of "wsds" survive a checkpoint's config (a resume reads them back); integers are
// numbers in period_lr_multipliers.
TEST(RunConfig, WsdsPeriodsRoundTrip) {
  const RunConfig c = parse(
      "[optim]\nschedule = \"wsds\"\nwarmup_steps = 2\ndecay_steps = 3\nperiod_steps = [10, "
      "6, 8]\nperiod_lr_multipliers = [1, 0.5, 0.25]\nmin_lr_ratio = 0.0\n");
  EXPECT_EQ(c.optim.schedule, LrSchedule::kWsds);
  EXPECT_EQ(c.optim.period_steps, (std::vector<int64_t>{10, 6, 8}));
  EXPECT_EQ(c.optim.period_lr_multipliers, (std::vector<double>{1.0, 0.5, 0.25}));
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(reparsed.optim.period_steps, c.optim.period_steps);
  EXPECT_EQ(reparsed.optim.period_lr_multipliers, c.optim.period_lr_multipliers);
  EXPECT_EQ(run_config_to_toml(reparsed), run_config_to_toml(c));
  std::string e = error_of(
      "[optim]\nschedule = \"wsds\"\nperiod_steps = [10]\n"
      "period_lr_multipliers = [1, \"a\"]\n");
  EXPECT_NE(e.find("optim.period_lr_multipliers must be a list of numbers"), std::string::npos)
      << e;
  e = error_of("[optim]\nschedule = \"wsds\"\nperiod_steps = 10\n");
  EXPECT_NE(e.find("optim.period_steps must be a list of integers"), std::string::npos) << e;
}

TEST(RunConfig, Mxfp8AndItsVariants) {
  RunConfig c = parse("[train]\nprecision = \"mxfp8\"\n");
  EXPECT_EQ(c.train.precision, TrainPrecision::kMxfp8);
  EXPECT_FALSE(c.train.mxfp8.expert_wgrad);
  EXPECT_EQ(c.train.mxfp8.scale_mode, mx::ScaleMode::kRceil);  // OLMo-core's default
  c = parse(
      "[train]\nprecision = \"mxfp8\"\nmxfp8_expert_wgrad = true\nmxfp8_dense = true\n"
      "mxfp8_scale = \"floor\"\n");
  EXPECT_TRUE(c.train.mxfp8.dense);
  EXPECT_TRUE(c.train.mxfp8.expert_wgrad);
  EXPECT_EQ(c.train.mxfp8.scale_mode, mx::ScaleMode::kFloor);
  const RunConfig reparsed = parse(run_config_to_toml(c));
  EXPECT_EQ(reparsed.train.precision, TrainPrecision::kMxfp8);
  EXPECT_TRUE(reparsed.train.mxfp8.expert_wgrad);
  EXPECT_TRUE(reparsed.train.mxfp8.dense);
  EXPECT_EQ(reparsed.train.mxfp8.scale_mode, mx::ScaleMode::kFloor);
  // A variant without mxfp8 is a mistake, not something to ignore.
  std::string e = error_of("[train]\nprecision = \"bf16\"\nmxfp8_scale = \"floor\"\n");
  EXPECT_NE(e.find("train.mxfp8_* are variants of train.precision=\"mxfp8\", not of \"bf16\""),
            std::string::npos)
      << e;
  e = error_of("[train]\nprecision = \"mxfp8\"\nmxfp8_scale = \"even\"\n");
  EXPECT_NE(e.find("train.mxfp8_scale=\"even\" is not one of \"rceil\", \"floor\""),
            std::string::npos)
      << e;
}

TEST(RunConfig, LoadFromFile) {
  const fs::path path = fs::path(::testing::TempDir()) /
                        ("moecore_run_config_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream out(path);
    out << kFull;
  }
  const RunConfig c = load_run_config(path.string(), {"train.keep_last=1"});
  EXPECT_EQ(c.train.keep_last, 1);
  EXPECT_EQ(c.model.hidden_size, 48);
  fs::remove(path);
  EXPECT_THROW(load_run_config(path.string()), Error);
}

TEST(RunConfig, ModelConfigDifference) {
  ModelConfig a, b;
  EXPECT_EQ(model_config_difference(a, b), "");
  b.num_experts = 16;
  std::string d = model_config_difference(a, b);
  EXPECT_NE(d.find("num_experts"), std::string::npos) << d;
  EXPECT_NE(d.find("8"), std::string::npos) << d;
  EXPECT_NE(d.find("16"), std::string::npos) << d;
  EXPECT_EQ(d.find("num_experts_per_tok"), std::string::npos) << d;

  b = a;
  b.qk_norm = QkNorm::kPerHead;
  d = model_config_difference(a, b);
  EXPECT_NE(d.find("qk_norm"), std::string::npos) << d;
  EXPECT_NE(d.find("per_head"), std::string::npos) << d;

  b = a;
  b.rope_theta = 20000.0;
  d = model_config_difference(a, b);
  EXPECT_NE(d.find("rope_theta"), std::string::npos) << d;

  b = a;
  b.tie_word_embeddings = true;
  EXPECT_NE(model_config_difference(a, b).find("tie_word_embeddings"), std::string::npos);
}

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// Issue 13: every float key finite and in range, integers without wrap-around, threads bounded.
TEST(RunConfigRanges, EveryFloatKeyMustBeFinite) {
  const char* keys[] = {"model.rope_theta",
                        "model.rms_norm_eps",
                        "model.router_aux_loss_coef",
                        "model.router_z_loss_coef",
                        "optim.lr",
                        "optim.beta1",
                        "optim.beta2",
                        "optim.eps",
                        "optim.weight_decay",
                        "optim.max_grad_norm",
                        "optim.min_lr_ratio",
                        "train.max_seconds",
                        "train.skip_sigma",
                        "train.gerrymander_threshold",
                        "parallel.capacity_factor"};
  for (const char* key : keys) {
    for (const char* value : {"inf", "-inf", "nan"}) {
      const std::string e = error_of("", {std::string(key) + "=" + value});
      EXPECT_NE(e.find(std::string(key) + "="), std::string::npos)
          << key << "=" << value << ": " << e;
      EXPECT_NE(e.find("finite"), std::string::npos) << key << "=" << value << ": " << e;
    }
  }
}

TEST(RunConfigRanges, FloatKeysOutOfRange) {
  EXPECT_NE(error_of("", {"model.rms_norm_eps=2.0"}).find("model.rms_norm_eps=2 must be in (0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of("", {"parallel.capacity_factor=5000"}).find("capacity_factor=5000"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.router_aux_loss_coef=-1"}).find("router_aux_loss_coef=-1"),
            std::string::npos);
}

TEST(RunConfigRanges, ThreadsAreBounded) {
  EXPECT_NE(error_of("", {"train.threads=65536"}).find("train.threads=65536 must be in [0, 1024]"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.threads=100000"}).find("train.threads=100000"), std::string::npos);
  EXPECT_EQ(error_of("", {"train.threads=1024"}), "");
}

TEST(RunConfigRanges, IntegersDoNotWrapAround) {
  EXPECT_NE(error_of("", {"train.seed=-1"}).find("train.seed=-1 is out of range"),
            std::string::npos);
}

}  // namespace
}  // namespace moecore
