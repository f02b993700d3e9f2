#include "cli/import_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "core/check.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/hf_config_reader.h"
#include "io/hf_side_files.h"
#include "io/hf_weights_reader.h"
#include "train/round_trip_check.h"
#include "train/run_config.h"

namespace moecore::cli {

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
  io::HfModelInfo info = hf.info;
  if (info.max_position_embeddings <= 0) info.max_position_embeddings = run.train.seq_len;
  const std::string staging = out_dir + ".import-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  MOE_CHECK(!ec, "[import] cannot create {}: {}", staging, ec.message());
  RoundTripCheck check;
  try {
    std::string tokenizer_json;
    if (fs::is_regular_file(hf_dir + "/tokenizer.json"))
      tokenizer_json = io::read_text(hf_dir + "/tokenizer.json", "[import]");
    write_model_dir(staging, layout, params,
                    {&run,
                     io::hf_config_json(hf.model, info),
                     {{"moecore_imported_from", fs::absolute(hf_dir).string()}},
                     tokenizer_json,
                     io::read_hf_side_files(hf_dir, hf.model.vocab_size, "[import]")});
    check = check_model_dir(staging, out_dir, hf.model, layout, params, "[import]");
    if (fs::exists(out_dir)) fs::remove(out_dir);  // empty, checked above
    fs::rename(staging, out_dir);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }

  std::string dtypes;
  for (const std::string& d : read.dtypes) dtypes += (dtypes.empty() ? "" : "+") + d;
  fmt::print(
      "import: {} ({}) from {}: {} tensors in {} file(s), {} -> fp32, {:.2f}M parameters -> {}\n"
      "self-check: reloaded logits equal the imported model's bit for bit ({} x {} tokens, max "
      "|diff| {:.3g}, max |logit| {:.4g})\n",
      hf.model_type, hf.model.block_norm == BlockNorm::kReordered ? "reordered norms" : "pre-norm",
      hf_dir, read.tensors, read.files, dtypes,
      static_cast<double>(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert)) /
          1e6,
      out_dir, check.batch, check.seq, check.max_abs_diff, check.max_abs_logit);
}

}  // namespace moecore::cli
