// OLMo-core's NumpyPaddedFSLDataset, the data of its LM evaluator: every document of the token
// files its own instance (padded to the sequence length when the model reads it), each file's
// documents carrying the label of the set it belongs to ([[data.lm_eval]]).
//
// Documents as OLMo-core's segment_documents_into_instances finds them in a local array: one ends
// at every EOS (included; the BOS plays no part, as the padded dataset passes none), tokens after
// a file's last EOS belong to no document, and a document longer than seq_len keeps its first
// seq_len tokens (the rest is not read); a file without an EOS is an error, as in OLMo-core.
// Documents are numbered in file order, the sets' files in the order given, as OLMo-core
// concatenates its paths; a label given to several sets gathers them (OLMo-core's metadata may
// label paths A, B, A). Token files are read as moecore reads them: OLMo-core reads a file with a
// NumPy header as raw bytes (the header as tokens), so its numbers match for headerless files. A
// set with label masks gives each document its slice of them (OLMo-core's padded label_mask);
// without, every position is 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/lm_eval_set.h"
#include "data/token_dataset.h"

namespace moecore::data {

class PaddedDocuments {
 public:
  // `eos_id`: the EOS that ends documents, -1: the one the sets' meta.json say (an explicit one
  // must agree with them). Errors (a set without a label or files, files that TokenDataset
  // refuses, no EOS known, a file without a document) are one-line moecore::Error naming the
  // set. `declared_dtype`: as TokenDataset::open's.
  static PaddedDocuments open(const std::vector<LmEvalSet>& sets, int64_t seq_len,
                              int64_t vocab_size, const std::string& declared_dtype,
                              int64_t eos_id);

  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()); }
  // The tokens document `doc` gives its instance: at most seq_len.
  int64_t length(int64_t doc) const { return documents_[static_cast<size_t>(doc)].length; }
  // Its tokens whose label mask is 1 (all of them where its set has no masks).
  int64_t labelled(int64_t doc) const { return documents_[static_cast<size_t>(doc)].labelled; }
  // Its label's index in labels().
  int label_index(int64_t doc) const { return documents_[static_cast<size_t>(doc)].label; }
  // The distinct labels, in the order they first come.
  const std::vector<std::string>& labels() const { return labels_; }
  int64_t seq_len() const { return seq_len_; }
  // The EOS id documents end at (open's, or the meta.json's).
  int64_t eos_id() const { return eos_id_; }

  // Copies document `doc` into tokens[0:length(doc)], and its label mask into mask[0:length(doc)]
  // (all 1 where its set has none).
  void read(int64_t doc, int32_t* tokens, uint8_t* mask) const;

 private:
  struct Document {
    int64_t start;     // in its file
    int64_t length;    // <= seq_len
    int64_t labelled;  // its tokens whose label mask is 1
    int32_t label;     // in labels_
    int32_t set;
    int32_t file;  // in its set's TokenDataset
  };
  std::vector<TokenDataset> sets_;   // each set's files, read as token streams
  std::vector<int32_t> set_labels_;  // each set's label, in labels_
  std::vector<std::string> labels_;
  std::vector<Document> documents_;
  int64_t seq_len_ = 0;
  int64_t metadata_eos_id_ = -1;  // the sets' meta.json's, -1: none says
  int64_t eos_id_ = -1;
};

}  // namespace moecore::data
