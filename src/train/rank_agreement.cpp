#include "train/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "core/escape.h"
#include "data/token_dataset.h"
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
  int64_t size = static_cast<int64_t>(text.size());
  world.broadcast(&size, sizeof(size), 0);
  std::string rank0_text = world.rank() == 0 ? text : std::string(static_cast<size_t>(size), '\0');
  if (size > 0) world.broadcast(rank0_text.data(), size, 0);
  const int64_t differs = rank0_text != text ? 1 : 0;
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.allgather(&differs, all.data(), 1, dist::CommType::kInt64);
  const auto first = std::find(all.begin(), all.end(), int64_t{1});
  if (first == all.end()) return;
  // The first differing rank's difference, in every rank's message: the job ends with the first
  // rank to fail, whichever prints.
  const int rank = static_cast<int>(first - all.begin());
  std::string detail = world.rank() == rank ? first_difference(text, rank0_text, rank) : "";
  int64_t length = static_cast<int64_t>(detail.size());
  world.broadcast(&length, sizeof(length), rank);
  detail.resize(static_cast<size_t>(length));
  world.broadcast(detail.data(), length, rank);
  fail(
      "[parallel] rank {}'s {} differs from rank 0's ({}; {} rank(s) differ): every rank of a job "
      "must read the same config, command line and token files",
      rank, what, detail, std::count(all.begin(), all.end(), int64_t{1}));
}

std::string run_agreement_text(const RunConfig& config, const TrainOptions& options) {
  return fmt::format("{}\n[command line]\nresume = {}\nallow_config_change = {}\ninit_from = {}\n",
                     run_config_to_toml(config), options.resume, options.allow_config_change,
                     options.init_from);
}

std::string dataset_agreement_text(const data::TokenDataset& dataset) {
  std::string text;
  for (size_t i = 0; i < dataset.num_files(); ++i)
    text += fmt::format("file {}: {} ({})\n", i, dataset.file_path(i), dataset.file_dtype(i));
  // FNV-1a over the first and the last instance: a corpus of the same sizes with other tokens.
  uint64_t checksum = 14695981039346656037ull;
  std::vector<int32_t> tokens(static_cast<size_t>(dataset.seq_len()));
  for (const int64_t index : {int64_t{0}, dataset.num_instances() - 1}) {
    if (index < 0) continue;
    dataset.read_instance(index, tokens.data());
    for (const int32_t token : tokens) {
      checksum ^= static_cast<uint32_t>(token);
      checksum *= 1099511628211ull;
    }
  }
  text += fmt::format(
      "tokens {}, instances {}, eos_id {}, first and last instances' FNV-1a {:016x}\n",
      dataset.total_tokens(), dataset.num_instances(), dataset.metadata_eos_id(), checksum);
  return text;
}

}  // namespace moecore
