// Token-level cross-entropy with ignore index -100, mean over counted tokens (as
// torch.nn.functional.cross_entropy). With no counted token the loss is 0 and the gradient is zero
// (PyTorch would return NaN; a batch of padding must not poison a run).
#pragma once

#include <cstdint>

#include "core/ignore_index.h"

namespace moecore {

struct CrossEntropyResult {
  double loss;  // mean over counted tokens
  int64_t counted_tokens;
};

// logits: [rows, vocab]; targets: [rows]. dlogits (may alias nothing) = d(loss * scale)/dlogits.
// Pass dlogits = nullptr for a forward-only evaluation. `normalizer` > 0 replaces the local count
// of targets as the divisor of the mean (data parallelism: the global batch's count).
CrossEntropyResult cross_entropy(const float* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab, float* dlogits, float scale,
                                 int64_t normalizer = 0);

}  // namespace moecore
