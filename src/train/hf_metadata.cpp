#include "train/hf_metadata.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "io/file_util.h"
#include "io/hf_config_reader.h"
#include "io/hf_side_files.h"

namespace moecore {

HfMetadata hf_metadata_of_run(int64_t seq_len, int64_t vocab_size, const data::Tokenizer* tokenizer,
                              const std::optional<std::string>& source_dir) {
  HfMetadata own;
  own.info.max_position_embeddings = seq_len;
  if (tokenizer != nullptr) own.info.eos_token_ids = std::vector<int32_t>{tokenizer->eos_id()};
  if (!source_dir) return own;

  constexpr const char* kTag = "[train]";
  const std::string& dir = *source_dir;
  HfMetadata source;
  // A checkpoint without config.json (none was ever written without one) says nothing more.
  source.info = io::read_hf_model_info(dir, vocab_size).value_or(io::HfModelInfo{});
  source.info.max_position_embeddings = std::max(source.info.max_position_embeddings, seq_len);
  source.side_files = io::read_hf_side_files(dir, vocab_size, kTag);
  const std::string tokenizer_path = dir + "/tokenizer.json";
  const bool source_has_tokenizer = std::filesystem::is_regular_file(tokenizer_path);
  const bool same_tokenizer =
      tokenizer != nullptr
          ? source_has_tokenizer && io::read_text(tokenizer_path, kTag) == tokenizer->to_json()
          : !source_has_tokenizer;
  if (same_tokenizer) return source;

  // The source's ids and files describe another tokenizer: the run's own stand, with the source's
  // context length (a property of the model, not of the tokenizer).
  own.info.max_position_embeddings = source.info.max_position_embeddings;
  own.info.output_router_logits = source.info.output_router_logits;
  std::vector<std::string> left;
  if (source.info.eos_token_ids || source.info.bos_token_id)
    left.emplace_back("config.json's token ids");
  for (const auto& [name, contents] : source.side_files) left.push_back(name);
  if (!left.empty())
    own.note = fmt::format(
        "note: {} of {} are not carried into this run's checkpoints: data.tokenizer is not {}",
        fmt::join(left, ", "), dir, tokenizer_path);
  return own;
}

}  // namespace moecore
