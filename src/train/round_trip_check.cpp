#include "train/round_trip_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/finite.h"
#include "dist/rank_reports.h"
#include "io/file_util.h"
#include "io/hf_config_reader.h"
#include "io/hf_side_files.h"
#include "io/hf_weights_reader.h"
#include "io/model_weights.h"
#include "kernels/matmul_precision.h"
#include "model/transformer.h"

namespace moecore {

namespace {

// The check batch: 2 sequences of 32 tokens spread over the whole vocabulary (Knuth's
// multiplicative hash), so every row of the embedding table is as likely as any other. Tiny: the
// check costs two forwards of 64 tokens besides the write and the read of the weights.
constexpr int64_t kCheckBatch = 2;
constexpr int64_t kCheckSeq = 32;

// fp32 GEMMs whatever the run's train.precision: "bit for bit" is a statement about the weights,
// and a bf16 forward would round away part of what it compares.
std::vector<float> logits_on_check_batch(const ModelConfig& config, const ParamLayout& layout,
                                         const ParamBuffers& params) {
  std::vector<int32_t> tokens(kCheckBatch * kCheckSeq), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] =
        static_cast<int32_t>((i * 2654435761ull) % static_cast<uint64_t>(config.vocab_size));
  for (size_t i = 0; i < tokens.size(); ++i)
    targets[i] = (i + 1) % kCheckSeq == 0 ? -100 : tokens[i + 1];
  Transformer model(config, layout);  // fp32 GEMMs (the default recipe)
  model.forward(params, tokens.data(), targets.data(), kCheckBatch, kCheckSeq);
  return host_copy(model.logits());
}

}  // namespace

void write_model_dir(const std::string& dir, const ParamLayout& layout, const ParamBuffers& params,
                     const ModelDirContents& contents) {
  constexpr const char* kTag = "[model-dir]";
  io::save_weights(layout, params, dir + "/model.safetensors", contents.weights_metadata);
  io::write_text_atomic(dir + "/config.json", contents.hf_config.dump(2) + "\n", kTag);
  io::write_text_atomic(dir + "/config.toml", run_config_to_toml(*contents.run), kTag);
  if (!contents.tokenizer_json.empty())
    io::write_text_atomic(dir + "/tokenizer.json", contents.tokenizer_json, kTag);
  io::write_hf_side_files(dir, contents.hf_side_files, kTag);
}

RoundTripCheck check_model_dir(const std::string& dir, const std::string& name,
                               const ModelConfig& model, const ParamLayout& layout,
                               const ParamBuffers& params, const char* tag) {
  const RunConfig reloaded_run =
      parse_run_config(io::read_text(dir + "/config.toml", tag), dir + "/config.toml");
  const std::string toml_difference = model_config_difference(reloaded_run.model, model);
  MOE_CHECK(toml_difference.empty(),
            "{} self-check: {}/config.toml reads back as another model ({})", tag, name,
            toml_difference);
  const io::HfModelConfig reloaded_hf = io::read_hf_model_config(dir);
  const std::string json_difference = model_config_difference(
      io::canonical_architecture(reloaded_hf.model), io::canonical_architecture(model));
  MOE_CHECK(json_difference.empty(),
            "{} self-check: {}/config.json reads back as another model ({})", tag, name,
            json_difference);
  // The weights as eval, generate and resume read a checkpoint's, and the directory's tensors as
  // import and --init-from would find them (headers only).
  ParamBuffers reloaded(layout);
  io::load_weights_from_dir(layout, dir, reloaded);
  io::check_hf_weights(layout, dir);
  const std::vector<float> expected = logits_on_check_batch(model, layout, params);
  const std::vector<float> got = logits_on_check_batch(reloaded_run.model, layout, reloaded);
  MOE_CHECK(got.size() == expected.size(), "{} self-check: {} gives {} logits, expected {}", tag,
            name, got.size(), expected.size());
  // Finite first: Inf or NaN weights are the likelier fault, and NaN compares unequal to itself.
  const float* non_finite = first_non_finite(expected.data(), expected.data() + expected.size());
  MOE_CHECK(non_finite == expected.data() + expected.size(),
            "{} self-check: the model's logits on the check batch are not finite ({} at "
            "position {} of {} x {} tokens): its weights hold Inf or NaN, or overflow",
            tag, *non_finite, static_cast<int64_t>(non_finite - expected.data()) / model.vocab_size,
            kCheckBatch, kCheckSeq);
  RoundTripCheck check{kCheckBatch, kCheckSeq, 0.0, 0.0, 0.0};
  for (size_t i = 0; i < got.size(); ++i) {
    check.max_abs_diff = std::max(check.max_abs_diff, std::fabs(static_cast<double>(got[i]) -
                                                                static_cast<double>(expected[i])));
    check.max_abs_logit =
        std::max(check.max_abs_logit, std::fabs(static_cast<double>(expected[i])));
  }
  MOE_CHECK(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0,
            "{} self-check: the logits of {} differ from those of the model in memory (max |diff| "
            "{:.3g} on {} x {} tokens)",
            tag, name, check.max_abs_diff, kCheckBatch, kCheckSeq);
  return check;
}

RoundTripCheck round_trip_check_on_rank0(const dist::Communicator& world,
                                         const std::string& scratch_dir, const ParamLayout& layout,
                                         const ParamBuffers* rank0_params,
                                         const ModelDirContents& contents, const char* tag) {
  namespace fs = std::filesystem;
  RoundTripCheck check;
  std::string error;
  if (world.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::error_code ec;
    try {
      MOE_CHECK(rank0_params != nullptr, "{} self-check: rank 0 holds no whole model", tag);
      const ParamBuffers& params = *rank0_params;
      fs::remove_all(scratch_dir, ec);
      fs::create_directories(scratch_dir, ec);
      MOE_CHECK(!ec, "{} self-check: cannot create {}: {}", tag, scratch_dir, ec.message());
      write_model_dir(scratch_dir, layout, params, contents);
      check = check_model_dir(scratch_dir, scratch_dir, contents.run->model, layout, params, tag);
    } catch (const std::exception& e) {
      error = e.what();
    }
    fs::remove_all(scratch_dir, ec);
    check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (world.size() > 1) {
    double figures[3] = {check.max_abs_diff, check.max_abs_logit, check.seconds};
    world.broadcast(figures, sizeof(figures), 0);
    error = dist::broadcast_text(world, std::move(error), 0);
    check = {kCheckBatch, kCheckSeq, figures[0], figures[1], figures[2]};
  }
  if (!error.empty()) throw Error(error);
  return check;
}

}  // namespace moecore
