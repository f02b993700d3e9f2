#include "data/padded_documents.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/check.h"

namespace moecore::data {

PaddedDocuments PaddedDocuments::open(const std::vector<LmEvalSet>& sets, int64_t seq_len,
                                      int64_t vocab_size, const std::string& declared_dtype,
                                      int64_t eos_id) {
  MOE_CHECK(seq_len >= 1, "[lm_eval] seq_len must be positive, got {}", seq_len);
  MOE_CHECK(eos_id >= -1 && eos_id < vocab_size,
            "[lm_eval] the EOS id {} that ends documents is outside the vocabulary [0, {})", eos_id,
            vocab_size);
  MOE_CHECK(!sets.empty(), "[lm_eval] no labelled sets given");
  PaddedDocuments docs;
  docs.seq_len_ = seq_len;
  std::string eos_source;
  for (size_t s = 0; s < sets.size(); ++s) {
    const LmEvalSet& set = sets[s];
    MOE_CHECK(!set.label.empty(), "[lm_eval] labelled set {} has no label", s);
    MOE_CHECK(!set.paths.empty(), "[lm_eval] set '{}' lists no token files", set.label);
    // A label given again gathers its sets (OLMo-core's metadata may label paths A, B, A).
    const auto known = std::find(docs.labels_.begin(), docs.labels_.end(), set.label);
    docs.set_labels_.push_back(static_cast<int32_t>(known - docs.labels_.begin()));
    if (known == docs.labels_.end()) docs.labels_.push_back(set.label);
    // One instance per token: the files as plain streams, none of their tail dropped.
    TokenDataset files =
        TokenDataset::open(set.paths, 1, vocab_size, declared_dtype, 0, set.label_mask);
    if (files.metadata_eos_id() >= 0) {
      MOE_CHECK(docs.metadata_eos_id_ < 0 || docs.metadata_eos_id_ == files.metadata_eos_id(),
                "[lm_eval] set '{}': its meta.json says eos_id={} but set '{}''s says {}",
                set.label, files.metadata_eos_id(), eos_source, docs.metadata_eos_id_);
      docs.metadata_eos_id_ = files.metadata_eos_id();
      eos_source = set.label;
    }
    docs.sets_.push_back(std::move(files));
  }
  MOE_CHECK(eos_id < 0 || docs.metadata_eos_id_ < 0 || eos_id == docs.metadata_eos_id_,
            "[lm_eval] documents end at EOS {} but the meta.json of set '{}' says eos_id={}",
            eos_id, eos_source, docs.metadata_eos_id_);
  const int64_t eos = eos_id >= 0 ? eos_id : docs.metadata_eos_id_;
  MOE_CHECK(eos >= 0,
            "[lm_eval] documents end at an EOS: set data.eos_id (or --eos-id; the sets' token "
            "files have no meta.json that says it)");
  MOE_CHECK(eos < vocab_size, "[lm_eval] eos_id={} is outside the vocabulary [0, {})", eos,
            vocab_size);
  docs.eos_id_ = eos;

  // Each file scanned once for its EOS tokens (its ids checked on the way), in blocks.
  constexpr int64_t kBlock = int64_t{1} << 16;
  std::vector<int32_t> block(static_cast<size_t>(kBlock));
  std::vector<uint8_t> mask(static_cast<size_t>(seq_len));
  for (size_t s = 0; s < docs.sets_.size(); ++s) {
    const TokenDataset& files = docs.sets_[s];
    for (size_t f = 0; f < files.num_files(); ++f) {
      const size_t first_document = docs.documents_.size();
      const int64_t n = files.file_tokens(f);
      int64_t start = 0;
      for (int64_t at = 0; at < n; at += kBlock) {
        const int64_t count = std::min(kBlock, n - at);
        files.read_tokens(f, at, count, block.data());
        for (int64_t i = 0; i < count; ++i) {
          if (block[static_cast<size_t>(i)] != eos) continue;
          const int64_t end = at + i + 1;  // the EOS is the document's last token
          const int64_t length = std::min(end - start, seq_len);
          int64_t labelled = length;
          if (files.has_label_masks()) {
            files.read_label_mask(f, start, length, mask.data());
            labelled = std::count(mask.begin(), mask.begin() + length, uint8_t{1});
          }
          docs.documents_.push_back({start, length, labelled, docs.set_labels_[s],
                                     static_cast<int32_t>(s), static_cast<int32_t>(f)});
          start = end;
        }
      }
      // OLMo-core's segment_documents_into_instances refuses a file without one.
      MOE_CHECK(docs.documents_.size() > first_document,
                "[lm_eval] set '{}': no document in {} (a document ends at the EOS id {}; tokens "
                "after a file's last EOS are none)",
                sets[s].label, files.file_path(f), eos);
    }
  }
  MOE_CHECK(docs.documents_.size() < size_t{std::numeric_limits<uint32_t>::max()},
            "[lm_eval] {} documents: OLMo-core's loader numbers fewer than 2^32 - 1 (uint32)",
            docs.documents_.size());
  return docs;
}

void PaddedDocuments::read(int64_t doc, int32_t* tokens, uint8_t* mask) const {
  MOE_CHECK(doc >= 0 && doc < num_documents(), "[lm_eval] document {} out of range [0, {})", doc,
            num_documents());
  const Document& d = documents_[static_cast<size_t>(doc)];
  const TokenDataset& files = sets_[static_cast<size_t>(d.set)];
  const auto file = static_cast<size_t>(d.file);
  files.read_tokens(file, d.start, d.length, tokens);
  if (files.has_label_masks())
    files.read_label_mask(file, d.start, d.length, mask);
  else
    std::fill(mask, mask + d.length, uint8_t{1});
}

}  // namespace moecore::data
