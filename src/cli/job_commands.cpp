#include "cli/job_commands.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "data/bpe_trainer.h"
#include "data/npy.h"
#include "data/prepare_corpus.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "io/model_weights.h"
#include "model/transformer.h"
#include "train/evaluate.h"
#include "train/run_config.h"
#include "train/sample.h"

namespace moecore::cli {

namespace {

std::string read_file(const std::string& path) {
  MOE_CHECK(std::filesystem::is_regular_file(path), "[cli] cannot read '{}' (not a file)", path);
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[cli] cannot open '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A checkpoint directory's configuration and weights.
struct LoadedModel {
  RunConfig config;
  ParamLayout layout;
  ParamBuffers params;
};

LoadedModel load_model(const std::string& dir) {
  MOE_CHECK(std::filesystem::is_directory(dir), "[cli] checkpoint '{}' is not a directory", dir);
  RunConfig config = parse_run_config(read_file(dir + "/config.toml"), dir + "/config.toml");
  ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  io::load_weights_from_dir(layout, dir, params);
  return {std::move(config), std::move(layout), std::move(params)};
}

}  // namespace

void run_tokenizer_train(const std::vector<std::string>& inputs, int64_t vocab_size,
                         const std::string& out) {
  for (const std::string& input : inputs)
    MOE_CHECK(std::filesystem::is_regular_file(input), "[tokenizer] input '{}' is not a file",
              input);
  const data::Tokenizer tokenizer = data::train_bpe(inputs, vocab_size, {"<|endoftext|>"});
  tokenizer.save(out);
  fmt::print("tokenizer: {} tokens -> {}\n", tokenizer.vocab_size(), out);
}

void run_tokenizer_encode(const std::string& tokenizer_path, const std::string& input,
                          const std::string& out) {
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  const std::vector<int32_t> ids = tokenizer.encode(read_file(input));
  const std::vector<uint32_t> wide(ids.begin(), ids.end());
  data::write_npy(out, "<u4", {static_cast<int64_t>(wide.size())}, wide.data());
}

void run_prepare(const std::string& tokenizer_path, const std::vector<std::string>& inputs,
                 const std::string& out, double val_fraction, bool overwrite) {
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  data::PrepareOptions options;
  options.overwrite = overwrite;
  options.tokenizer_path = tokenizer_path;
  const data::PrepareStats stats = data::prepare_corpus(
      inputs, [&](std::string_view text) { return tokenizer.encode(text); }, tokenizer.eos_id(),
      tokenizer.vocab_size(), out, val_fraction, options);
  fmt::print("prepare: {} train documents ({} tokens), {} val documents ({} tokens), {} -> {}\n",
             stats.train_documents, stats.train_tokens, stats.val_documents, stats.val_tokens,
             stats.dtype, out);
}

void run_eval(const std::string& checkpoint, const std::vector<std::string>& data,
              int64_t max_instances) {
  LoadedModel m = load_model(checkpoint);
  const data::TokenDataset dataset =
      data::TokenDataset::open(data, m.config.train.seq_len, m.config.model.vocab_size);
  Transformer model(m.config.model, m.layout);
  const int64_t rows = m.config.train.batch_size / m.config.train.microbatches;
  const EvalResult r = evaluate(model, m.params, dataset, rows, max_instances);
  fmt::print("eval: loss {:.4f}  perplexity {:.3f}  ({} instances, {} tokens)\n", r.loss,
             r.perplexity, r.instances, r.tokens);
}

void run_generate(const GenerateArgs& args) {
  LoadedModel m = load_model(args.checkpoint);
  std::string tokenizer_path = args.tokenizer;
  if (tokenizer_path.empty()) tokenizer_path = args.checkpoint + "/tokenizer.json";
  MOE_CHECK(std::filesystem::is_regular_file(tokenizer_path),
            "[generate] no tokenizer: {} does not exist (pass --tokenizer)", tokenizer_path);
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  SamplingConfig sampling;
  sampling.temperature = args.temperature;
  sampling.top_k = args.top_k;
  sampling.top_p = args.top_p;
  sampling.seed = args.seed;
  const std::string text = generate_text(m.config.model, m.layout, m.params, tokenizer, args.prompt,
                                         args.max_tokens, sampling);
  fmt::print("{}{}\n", args.prompt, text);
}

}  // namespace moecore::cli
