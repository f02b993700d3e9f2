// Every rank of a job reads its own config file, command line and token files. Where they differ
// (hosts holding different copies, a config edited while the job started, a relative path that
// resolves elsewhere on a remote host), the ranks run different steps: one waits forever in a
// collective that another never reaches, MPI fails in the middle of an exchange of mismatched
// sizes, or the replicas train apart and the job exits 0 with a checkpoint that mixes them. So the
// trainer compares what each rank read with rank 0's once, at start-up, before anything depends on
// it.
#pragma once

#include <string>
#include <string_view>

#include "dist/communicator.h"
#include "train/run_config.h"

namespace moecore {

struct TrainOptions;

namespace data {
class TokenDataset;
struct DatasetFingerprint;
}  // namespace data

// Collective over `world`: each rank's `text` against rank 0's. Where any rank's differs, every
// rank throws the same one-line moecore::Error naming the first differing rank and its first
// differing line ("[train] max_steps = 6 on rank 1, max_steps = 4 on rank 0"). `what` names the
// text ("effective config").
void check_ranks_agree(const dist::Communicator& world, std::string_view what,
                       const std::string& text);

// The text check_ranks_agree compares for a run: the effective config (its TOML, sections and
// all) and the command line's options that change what the ranks do.
std::string run_agreement_text(const RunConfig& config, const TrainOptions& options);

// The same for a token dataset, from what opening it read: each file's path and element type,
// and its fingerprint (data::dataset_fingerprint: another corpus of the same sizes).
std::string dataset_agreement_text(const data::TokenDataset& dataset,
                                   const data::DatasetFingerprint& fingerprint);

}  // namespace moecore
