#include "train/training_data.h"

#include <fmt/format.h>

#include "core/check.h"

namespace moecore {

data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor, int64_t dp_ranks) {
  return data::DataLoader(
      dataset,
      data::InstanceOrder::with_rule(config.data.order, config.train.seed, dataset.num_instances(),
                                     config.train.batch_size),
      cursor, dp_ranks);
}

ResumePosition resume_position(const RunConfig& saved, const TrainerState& state,
                               const std::string& checkpoint, const RunConfig& config,
                               int64_t instances) {
  const TrainConfig &was = saved.train, &now = config.train;
  const uint64_t saved_cursor = state.data_cursor;
  ResumePosition position{.cursor = saved_cursor};
  if (saved.data.order != data::OrderRule::kOlmoCore ||
      config.data.order != data::OrderRule::kOlmoCore ||
      (was.batch_size == now.batch_size && was.seq_len == now.seq_len) || saved_cursor == 0)
    return position;
  MOE_CHECK(was.seq_len == now.seq_len || state.train_data.has_value(),
            "[train] --resume: {} does not record its training set's instances (an older "
            "moecore wrote it), which data.order = \"olmo-core\" needs to move its data position "
            "to train.seq_len={}; keep train.seq_len={}",
            checkpoint, now.seq_len, was.seq_len);
  // The saved run's instances: as this run's under the same seq_len, unless its contents changed.
  const int64_t saved_instances = state.train_data ? state.train_data->instances : instances;
  const auto old_epoch = static_cast<uint64_t>(
      data::InstanceOrder::with_rule(saved.data.order, was.seed, saved_instances, was.batch_size)
          .epoch_length());
  const int64_t new_epoch =
      data::InstanceOrder::with_rule(config.data.order, now.seed, instances, now.batch_size)
          .epoch_length();
  // The epoch of the last instance read (0-based) and how far into it the run had read: a cursor
  // at a boundary has read the whole epoch that ended there.
  const uint64_t epoch = (saved_cursor - 1) / old_epoch;
  const auto read = static_cast<int64_t>(saved_cursor - epoch * old_epoch);
  // At most the saved run's instances times its seq_len: tokens of the files, far below 2^63.
  const int64_t tokens_read = read * was.seq_len;
  const int64_t batch_tokens = now.batch_size * now.seq_len;
  // Past the epoch's last whole batch OLMo-core's loader yields nothing: the next epoch follows.
  const int64_t batches = std::min(tokens_read / batch_tokens, new_epoch / now.batch_size);
  position.moved = true;
  position.epoch = epoch + 1;
  position.offset = batches * now.batch_size;
  position.epoch_length = new_epoch;
  position.tokens_read = tokens_read;
  position.read_again = was.seq_len == now.seq_len ? read - position.offset : 0;
  const bool fits =
      !__builtin_mul_overflow(epoch, static_cast<uint64_t>(new_epoch), &position.cursor) &&
      !__builtin_add_overflow(position.cursor, static_cast<uint64_t>(position.offset),
                              &position.cursor);
  MOE_CHECK(fits, "[train] --resume: the data position of epoch {} does not fit a cursor",
            position.epoch);
  return position;
}

std::string describe_resume_position(const RunConfig& saved, const RunConfig& config,
                                     const ResumePosition& position) {
  const TrainConfig &was = saved.train, &now = config.train;
  std::string changed;
  if (was.batch_size != now.batch_size)
    changed = fmt::format("train.batch_size {} -> {}", was.batch_size, now.batch_size);
  if (was.seq_len != now.seq_len)
    changed += fmt::format("{}train.seq_len {} -> {}", changed.empty() ? "" : " and ", was.seq_len,
                           now.seq_len);
  const std::string after =
      was.seq_len != now.seq_len
          ? "the instances are cut anew"
          : fmt::format("{} instance(s) read before are read again", position.read_again);
  const std::string where =
      position.offset == position.epoch_length
          ? fmt::format("at the start of epoch {}", position.epoch + 1)
          : fmt::format("in epoch {} at instance {} of its {}", position.epoch, position.offset,
                        position.epoch_length);
  return fmt::format(
      "note: data.order = \"olmo-core\" with {}: the run goes on {} (as OLMo-core's loader: the "
      "{} tokens read in epoch {} fill {} global batch(es) of {} x {} tokens; {})",
      changed, where, position.tokens_read, position.epoch, position.offset / now.batch_size,
      now.batch_size, now.seq_len, after);
}

}  // namespace moecore
