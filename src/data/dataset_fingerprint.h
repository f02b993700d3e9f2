// What identifies a training set's contents without reading all of it: its tokens, its instances
// and a hash of 33 instances spread evenly over it (the first and the last among them; with label
// masks their targets too). A resumed
// run compares it with the one its checkpoint recorded: the same path with a part added,
// regenerated or removed would otherwise be read in another order from the same cursor (the order
// is a shuffle over the instance count), re-reading some instances and never reaching others.
// Every rank compares its own with rank 0's at start-up (train/rank_agreement.h).
#pragma once

#include <cstdint>
#include <string>

namespace moecore::data {

class TokenDataset;

struct DatasetFingerprint {
  int64_t tokens = 0;     // in the files, instances or not
  int64_t instances = 0;  // of the dataset's seq_len
  uint64_t sample_hash = 0;
  bool operator==(const DatasetFingerprint&) const = default;
};

DatasetFingerprint dataset_fingerprint(const TokenDataset& dataset);

// "200 instances, 6432 tokens, sample hash 0123456789abcdef".
std::string describe(const DatasetFingerprint& fingerprint);

}  // namespace moecore::data
