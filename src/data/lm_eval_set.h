// One labelled validation set of OLMo-core's LM evaluator ([[data.lm_eval]]): its token files (or
// directories of them, as data.val), the label its metrics carry (OLMo-core's dataset metadata
// "label") and its label masks (OLMo-core's label_mask_paths: one per token file, as
// data.val_label_mask; empty: none), read by data/padded_documents.h.
#pragma once

#include <string>
#include <vector>

namespace moecore::data {

struct LmEvalSet {
  std::string label;
  std::vector<std::string> paths;
  std::vector<std::string> label_mask;
};

}  // namespace moecore::data
