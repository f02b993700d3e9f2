#include "cli/import_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/hf_config_reader.h"
#include "io/hf_weights_reader.h"
#include "io/model_weights.h"
#include "model/transformer.h"
#include "train/run_config.h"

namespace moecore::cli {

namespace {

// The self-check's batch: 2 sequences of 32 tokens spread over the whole vocabulary
// (Knuth's multiplicative hash), so every row of the embedding table is as likely as any other.
constexpr int64_t kCheckBatch = 2;
constexpr int64_t kCheckSeq = 32;

std::vector<float> logits_on_check_batch(const ModelConfig& config, const ParamLayout& layout,
                                         const ParamBuffers& params) {
  std::vector<int32_t> tokens(kCheckBatch * kCheckSeq), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] =
        static_cast<int32_t>((i * 2654435761ull) % static_cast<uint64_t>(config.vocab_size));
  for (size_t i = 0; i < tokens.size(); ++i)
    targets[i] = (i + 1) % kCheckSeq == 0 ? -100 : tokens[i + 1];
  Transformer model(config, layout);
  model.forward(params, tokens.data(), targets.data(), kCheckBatch, kCheckSeq);
  return model.logits();
}

// Reads the written directory back the way `eval`, `generate` and `debug-state` do (config.toml
// and the weights) and through the Hugging Face reader (config.json): the same architecture, and
// logits on the check batch equal to the imported model's bit for bit (fp32 written and read back
// is the same bits, and the same forward of the same bits is too). Returns those logits.
std::vector<float> self_check(const ModelConfig& model, const ParamLayout& layout,
                              const ParamBuffers& params, const std::string& dir,
                              const std::string& name) {
  const RunConfig reloaded_run =
      parse_run_config(io::read_text(dir + "/config.toml", "[import]"), dir + "/config.toml");
  const std::string toml_difference = model_config_difference(reloaded_run.model, model);
  MOE_CHECK(toml_difference.empty(),
            "[import] self-check: {}/config.toml reads back as another model ({})", name,
            toml_difference);
  const io::HfModelConfig reloaded_hf = io::read_hf_model_config(dir);
  const std::string json_difference = model_config_difference(
      io::canonical_architecture(reloaded_hf.model), io::canonical_architecture(model));
  MOE_CHECK(json_difference.empty(),
            "[import] self-check: {}/config.json reads back as another model ({})", name,
            json_difference);
  ParamBuffers reloaded(layout);
  io::read_hf_weights(layout, dir, reloaded);
  const std::vector<float> expected = logits_on_check_batch(model, layout, params);
  const std::vector<float> got = logits_on_check_batch(reloaded_run.model, layout, reloaded);
  MOE_CHECK(got.size() == expected.size() &&
                std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0,
            "[import] self-check: the logits of {} differ from those of the imported model", name);
  for (const float v : expected)
    MOE_CHECK(std::isfinite(v), "[import] self-check: the imported model's logits are not finite");
  return expected;
}

}  // namespace

void run_import(const std::string& hf_dir, const std::string& out_arg) {
  namespace fs = std::filesystem;
  // "out/" names the directory "out": its staging sibling must not land inside it.
  fs::path out_path = fs::path(out_arg).lexically_normal();
  if (!out_path.has_filename()) out_path = out_path.parent_path();
  const std::string out_dir = out_path.string();
  MOE_CHECK(!out_dir.empty() && out_dir != "." && out_dir != "..",
            "[import] --out '{}' does not name a new directory", out_arg);
  const io::HfModelConfig hf = io::read_hf_model_config(hf_dir);
  const ParamLayout layout = ParamLayout::build(hf.model);
  ParamBuffers params(layout);
  const io::HfWeightsRead read = io::read_hf_weights(layout, hf_dir, params);
  MOE_CHECK(!fs::exists(out_dir) || (fs::is_directory(out_dir) && fs::is_empty(out_dir)),
            "[import] --out {} already exists and is not an empty directory", out_dir);

  RunConfig run;
  run.model = hf.model;
  const int64_t max_positions =
      hf.max_position_embeddings > 0 ? hf.max_position_embeddings : run.train.seq_len;
  const std::string staging = out_dir + ".import-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  MOE_CHECK(!ec, "[import] cannot create {}: {}", staging, ec.message());
  std::vector<float> expected;
  try {
    io::save_weights(layout, params, staging + "/model.safetensors",
                     {{"moecore_imported_from", fs::absolute(hf_dir).string()}});
    io::write_text_atomic(
        staging + "/config.json",
        io::hf_config_json(hf.model, max_positions, hf.eos_token_id).dump(2) + "\n", "[import]");
    io::write_text_atomic(staging + "/config.toml", run_config_to_toml(run), "[import]");
    if (fs::is_regular_file(hf_dir + "/tokenizer.json"))
      io::write_text_atomic(staging + "/tokenizer.json",
                            io::read_text(hf_dir + "/tokenizer.json", "[import]"), "[import]");
    expected = self_check(hf.model, layout, params, staging, out_dir);
    if (fs::exists(out_dir)) fs::remove(out_dir);  // empty, checked above
    fs::rename(staging, out_dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }

  float max_abs = 0.0f;
  for (const float v : expected) max_abs = std::max(max_abs, std::fabs(v));
  std::string dtypes;
  for (const std::string& d : read.dtypes) dtypes += (dtypes.empty() ? "" : "+") + d;
  fmt::print(
      "import: {} ({}) from {}: {} tensors in {} file(s), {} -> fp32, {:.2f}M parameters -> {}\n"
      "self-check: reloaded logits equal the imported model's bit for bit ({} x {} tokens, max "
      "|logit| {:.4g})\n",
      hf.model_type, hf.model.block_norm == BlockNorm::kReordered ? "reordered norms" : "pre-norm",
      hf_dir, read.tensors, read.files, dtypes,
      static_cast<double>(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert)) /
          1e6,
      out_dir, kCheckBatch, kCheckSeq, max_abs);
}

}  // namespace moecore::cli
