// `moecore prepare`: text files to OLMo-core style token files.
//
// Every non-blank line of every input file is one document (the default KJV corpus has one verse a
// line); each document is tokenised and followed by EOS, and the documents are concatenated into
// flat token streams (uint16 when vocab_size <= 65536, else uint32), split into parts of at most
// max_tokens_per_part tokens. The last val_fraction of the documents, by position, form the
// validation split, so the split is reproducible and never interleaves with training text:
//
//   out_dir/train/part-00000.npy ...   out_dir/val/part-00000.npy ...   out_dir/meta.json
//
// The parts are OLMo-core / Dolma token files: the raw little-endian elements and nothing else
// (OLMo-core's NumpyFSLDataset memory-maps a .npy path with np.memmap and would read a NumPy
// header as 64 tokens). meta.json says the element type ("dtype": "uint16") and "eos_id", and
// lists the parts, which is how moecore's reader knows the type without a declaration.
// npy_header = true writes real NumPy files instead (np.load reads them; OLMo-core does not).
//
// The whole directory is built next to out_dir and renamed into place at the end, so out_dir holds
// either the previous complete corpus or the new complete one, never a mixture.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moecore::data {

// The tokenizer seen as a function, so that preparation does not depend on one tokenizer class
// (and tests can use a trivial one). For moecore's Tokenizer:
//   [&](std::string_view text) { return tokenizer.encode(text); }
using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;

struct PrepareOptions {
  // Replace an existing out_dir. Only a directory that is empty or holds a meta.json (an earlier
  // prepared corpus) is replaced, so a mistyped --out cannot delete unrelated data.
  bool overwrite = false;
  // Tokens per .npy part: 64Mi tokens keeps each part at 128/256 MiB.
  int64_t max_tokens_per_part = int64_t{1} << 26;
  // Recorded in meta.json when not empty.
  std::string tokenizer_path;
  // Element type "uint16" or "uint32"; empty: uint16 when vocab_size <= 65536, else uint32.
  std::string dtype;
  // Write NumPy .npy files (128-byte header) instead of OLMo-core's headerless streams.
  bool npy_header = false;
};

struct PrepareStats {
  std::string dtype;  // "uint16" or "uint32".
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;  // EOS included.
  int64_t val_tokens = 0;
  std::vector<std::string> train_files;  // Final paths under out_dir.
  std::vector<std::string> val_files;    // Empty when val_fraction == 0.
};

// val_fraction in [0, 1): the number of validation documents is floor(documents * val_fraction),
// at least 1 when val_fraction > 0, and at least one document is always left for training.
// Errors (unreadable input, no documents, id outside [0, vocab_size), out_dir exists without
// overwrite, unwritable destination) are one-line moecore::Error; out_dir is then untouched.
PrepareStats prepare_corpus(const std::vector<std::string>& input_files, const EncodeFn& encode,
                            int32_t eos_id, int64_t vocab_size, const std::string& out_dir,
                            double val_fraction, const PrepareOptions& options = {});

}  // namespace moecore::data
