// The files of a Hugging Face model directory that moecore carries without reading them: the
// generation settings transformers' `generate` uses (generation_config.json) and the tokenizer's
// own settings and chat template (tokenizer_config.json, special_tokens_map.json,
// chat_template.jinja / .json). An import, and the checkpoints of a run started from such a model
// (`train --init-from`, and its resumes), keep them byte for byte beside the tokenizer they
// describe, so that the model moecore writes behaves in transformers as the one it read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moecore::io {

// name -> contents of each side file present in `dir` (regular files only; a directory or other
// non-file under one of these names is an error naming it). generation_config.json's EOS ids are
// checked against `vocab_size` here, so that a model is refused where it is read rather than
// where generation first needs them.
std::map<std::string, std::string> read_hf_side_files(const std::string& dir, int64_t vocab_size,
                                                      const char* tag);

// generation_config.json's eos_token_id (`text`, the file at `origin`): where generation stops,
// ahead of config.json's; nullopt when it names none. Text that is not JSON, or an id outside
// [0, vocab_size), is a one-line error.
std::optional<std::vector<int32_t>> generation_config_eos_token_ids(const std::string& text,
                                                                    const std::string& origin,
                                                                    int64_t vocab_size,
                                                                    const char* tag);

// Writes each into `dir` (atomically, as every file of a checkpoint).
void write_hf_side_files(const std::string& dir, const std::map<std::string, std::string>& files,
                         const char* tag);

}  // namespace moecore::io
