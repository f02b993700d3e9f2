#include "train/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "core/escape.h"
#include "data/dataset_fingerprint.h"
#include "data/token_dataset.h"
#include "dist/rank_reports.h"
#include "train/trainer.h"

namespace moecore {

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The first line where `mine` (rank `rank`'s) and `theirs` (rank 0's) part, with the TOML section
// it is in: "[train] max_steps = 6 on rank 1, max_steps = 4 on rank 0".
std::string first_difference(const std::string& mine, const std::string& theirs, int rank) {
  const std::vector<std::string> a = lines_of(mine), b = lines_of(theirs);
  std::string section;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string here = i < a.size() ? a[i] : "(nothing)";
    const std::string there = i < b.size() ? b[i] : "(nothing)";
    if (here == there) {
      if (here.starts_with('[')) section = here + " ";
      continue;
    }
    return escape_for_message(
        fmt::format("{}{} on rank {}, {} on rank 0", section, here, rank, there));
  }
  return "the same lines in another order";  // not reached: equal lines make equal texts
}

}  // namespace

void check_ranks_agree(const dist::Communicator& world, std::string_view what,
                       const std::string& text) {
  if (world.size() == 1) return;
  const std::string rank0_text = dist::broadcast_text(world, text, 0);
  // Every differing rank names its first difference; the lowest one's goes into every rank's
  // message (the job ends with whichever rank prints first).
  const dist::FirstReport first = dist::first_report(
      world, text == rank0_text ? std::string() : first_difference(text, rank0_text, world.rank()));
  MOE_CHECK(first.rank < 0,
            "[parallel] rank {}'s {} differs from rank 0's ({}; {} rank(s) differ): every rank of "
            "a job must read the same config, command line and token files",
            first.rank, what, first.text, first.reporting);
}

std::string run_agreement_text(const RunConfig& config, const TrainOptions& options) {
  return fmt::format("{}\n[command line]\nresume = {}\nallow_config_change = {}\ninit_from = {}\n",
                     run_config_to_toml(config), options.resume, options.allow_config_change,
                     options.init_from);
}

std::string dataset_agreement_text(const data::TokenDataset& dataset,
                                   const data::DatasetFingerprint& fingerprint) {
  std::string text;
  for (size_t i = 0; i < dataset.num_files(); ++i)
    text += fmt::format("file {}: {} ({})\n", i, dataset.file_path(i), dataset.file_dtype(i));
  text += fmt::format("{}, eos_id {}\n", data::describe(fingerprint), dataset.metadata_eos_id());
  return text;
}

}  // namespace moecore
