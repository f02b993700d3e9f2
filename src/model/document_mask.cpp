#include "model/document_mask.h"

#include "core/check.h"

namespace moecore {

namespace {

// Whether a document ends with the row's token t: an EOS, which with a BOS id must be followed by
// a BOS in the row.
bool ends_document(const int32_t* row, int64_t seq, int64_t t, int32_t eos_id, int32_t bos_id) {
  return row[t] == eos_id && (bos_id < 0 || (t + 1 < seq && row[t + 1] == bos_id));
}

}  // namespace

void document_starts(const int32_t* tokens, int64_t batch, int64_t seq, int32_t eos_id,
                     int32_t bos_id, int32_t* doc_start) {
  MOE_CHECK(eos_id >= 0, "[model] document masking needs an EOS id, got {}", eos_id);
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = tokens + b * seq;
    int32_t* start = doc_start + b * seq;
    int32_t current = 0;  // every row starts a document: instances cut documents
    for (int64_t t = 0; t < seq; ++t) {
      start[t] = current;
      // The EOS belongs to the document it ends; the next token opens a new one.
      if (ends_document(row, seq, t, eos_id, bos_id)) current = static_cast<int32_t>(t + 1);
    }
  }
}

std::vector<int64_t> document_lengths(const int32_t* row, int64_t seq, int32_t eos_id,
                                      int32_t bos_id) {
  std::vector<int64_t> lengths;
  int64_t begin = 0;
  for (int64_t t = 0; t < seq; ++t) {
    if (ends_document(row, seq, t, eos_id, bos_id)) {
      lengths.push_back(t + 1 - begin);
      begin = t + 1;
    }
  }
  if (begin < seq) lengths.push_back(seq - begin);
  return lengths;
}

}  // namespace moecore
