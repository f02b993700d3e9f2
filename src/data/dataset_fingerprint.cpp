#include "data/dataset_fingerprint.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <vector>

#include "core/fnv1a.h"
#include "data/token_dataset.h"

namespace moecore::data {

namespace {

// Instances sampled: enough that a regenerated or reordered part is all but certainly seen, few
// enough that a start-up on a corpus of any size reads only kilobytes.
constexpr int64_t kSampledInstances = 33;

}  // namespace

DatasetFingerprint dataset_fingerprint(const TokenDataset& dataset) {
  DatasetFingerprint fingerprint{dataset.total_tokens(), dataset.num_instances(),
                                 kFnv1aOffsetBasis};
  const int64_t n = dataset.num_instances();
  std::vector<int32_t> tokens(static_cast<size_t>(dataset.seq_len()));
  std::vector<int32_t> targets(tokens.size());
  const int64_t samples = std::min(n, kSampledInstances);
  for (int64_t i = 0; i < samples; ++i) {
    // Evenly spaced, the first and the last included (every instance where there are fewer).
    const int64_t index = samples == 1 ? 0 : i * (n - 1) / (samples - 1);
    // With label masks the instance's targets too: a mask rewritten under the same path changes
    // what trains. (Without, the hash is the tokens' alone, as checkpoints have recorded it.)
    const bool masked = dataset.has_label_masks();
    if (masked)
      dataset.read_example(index, tokens.data(), targets.data());
    else
      dataset.read_instance(index, tokens.data());
    fingerprint.sample_hash = fnv1a(std::as_bytes(std::span(tokens)), fingerprint.sample_hash);
    if (masked)
      fingerprint.sample_hash = fnv1a(std::as_bytes(std::span(targets)), fingerprint.sample_hash);
  }
  return fingerprint;
}

std::string describe(const DatasetFingerprint& fingerprint) {
  return fmt::format("{} instances, {} tokens, sample hash {:016x}", fingerprint.instances,
                     fingerprint.tokens, fingerprint.sample_hash);
}

}  // namespace moecore::data
