// What a run's checkpoints say of the model beyond its weights and architecture: config.json's
// context length, token ids and router-logits flag (io::HfModelInfo), and the Hugging Face side
// files (io/hf_side_files.h).
//
// A run of its own says its train.seq_len and its tokenizer's EOS. A run started from a Hugging
// Face model (`train --init-from DIR`) keeps DIR's, and a resumed run its checkpoint's, so that a
// fine-tuned model behaves in transformers (generation settings, chat template, context length) as
// the one it started from, as long as the run's tokenizer is that model's (byte for byte): the ids
// name its tokens and the side files describe it. Otherwise they are left behind, and `note` says
// so. The context length is never below the run's seq_len.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "data/tokenizer.h"
#include "io/hf_config.h"

namespace moecore {

struct HfMetadata {
  io::HfModelInfo info;
  std::map<std::string, std::string> side_files;
  std::string note;  // a start-up line when the source's could not be carried, else empty
};

// `source_dir`: the checkpoint resumed from, else the --init-from model, else none.
HfMetadata hf_metadata_of_run(int64_t seq_len, int64_t vocab_size, const data::Tokenizer* tokenizer,
                              const std::optional<std::string>& source_dir);

}  // namespace moecore
