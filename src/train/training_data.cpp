#include "train/training_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <vector>

#include "core/check.h"

namespace moecore {

data::TokenDataset open_training_set(const RunConfig& config) {
  return data::TokenDataset::open(config.data.train, config.train.seq_len, config.model.vocab_size,
                                  config.data.dtype, config.data.max_target_seq_len,
                                  config.data.label_mask);
}

int64_t epoch_length(const RunConfig& config, int64_t instances) {
  return data::InstanceOrder::with_rule(config.data.order, config.train.seed, instances,
                                        config.train.batch_size)
      .epoch_length();
}

data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor, int64_t dp_ranks) {
  data::DataLoader loader(
      dataset,
      data::InstanceOrder::with_rule(config.data.order, config.train.seed, dataset.num_instances(),
                                     config.train.batch_size, dataset.instances_per_chunk()),
      cursor, dp_ranks);
  if (config.data.instance_filter) loader.set_instance_filter(config.data.repetition);
  return loader;
}

namespace {

// max_epochs x the instances an epoch visits under the run's order and batch size: where a run
// of train.max_epochs ends its reading.
uint64_t instances_of_max_epochs(const RunConfig& config, const data::TokenDataset& dataset) {
  const TrainConfig& t = config.train;
  const int64_t epoch =
      data::InstanceOrder::with_rule(config.data.order, t.seed, dataset.num_instances(),
                                     t.batch_size, dataset.instances_per_chunk())
          .epoch_length();
  MOE_CHECK(epoch > 0,
            "[train] train.max_epochs={}: an epoch of the training set's {} instances holds no "
            "whole global batch of train.batch_size={}",
            t.max_epochs, dataset.num_instances(), t.batch_size);
  uint64_t end = 0;
  MOE_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(t.max_epochs),
                                    static_cast<uint64_t>(epoch), &end) &&
                end <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
            "[train] train.max_epochs={} of {} instances overflows a data position", t.max_epochs,
            epoch);
  return end;
}

}  // namespace

int64_t max_steps_for_epochs(const RunConfig& config, const data::TokenDataset& dataset,
                             int64_t origin_step, uint64_t origin_cursor) {
  const uint64_t end = instances_of_max_epochs(config, dataset);
  const auto batch = static_cast<uint64_t>(config.train.batch_size);
  const uint64_t left = end > origin_cursor ? end - origin_cursor : 0;
  return origin_step + static_cast<int64_t>(left / batch + (left % batch != 0 ? 1 : 0));
}

int64_t last_step_with_data(const RunConfig& config, const data::TokenDataset& dataset,
                            const ReplayOrigin& origin) {
  const TrainConfig& t = config.train;
  if (t.hard_stop_epochs == 0) return last_step(t, token_origin(origin));
  RunConfig counted = config;
  counted.train.max_epochs = t.hard_stop_epochs;
  return std::min(t.max_steps,
                  max_steps_for_epochs(counted, dataset, origin.step, origin.data_cursor));
}

namespace {

// Whether checkpoint state `state`, written under `saved` (its training set of `instances`,
// unless the state records its own), is past `max_epochs` epochs as the saved run counted them:
// the update before its last had already reached the end.
bool past_max_epochs(const RunConfig& saved, const TrainerState& state, int64_t instances,
                     int64_t max_epochs) {
  const TrainConfig& was = saved.train;
  const int64_t saved_instances = state.train_data ? state.train_data->instances : instances;
  const auto epoch = static_cast<uint64_t>(epoch_length(saved, saved_instances));
  uint64_t end = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(max_epochs), epoch, &end)) return false;
  const auto batch = static_cast<uint64_t>(was.batch_size);
  return state.data_cursor >= batch && state.data_cursor - batch >= end;
}

}  // namespace

int64_t resumed_max_steps(const RunConfig& saved, const TrainerState& state,
                          const std::string& checkpoint, const RunConfig& config, bool changed,
                          const data::TokenDataset* dataset, const ResumePosition& position,
                          const char* tag) {
  const TrainConfig &was = saved.train, &tc = config.train;
  if (tc.max_tokens > 0) {
    MOE_CHECK(state.step == 0 || state.tokens_seen - was.batch_size * was.seq_len < tc.max_tokens,
              "{} --resume: {} is at step {} with {} tokens seen, past train.max_tokens={}: "
              "raise train.max_tokens to continue the run",
              tag, checkpoint, state.step, state.tokens_seen, tc.max_tokens);
    return max_steps_for_tokens(tc, schedule_origin(state, changed));
  }
  if (tc.max_epochs > 0) {
    MOE_CHECK(dataset != nullptr, "{} train.max_epochs needs the training set", tag);
    MOE_CHECK(!past_max_epochs(saved, state, dataset->num_instances(), tc.max_epochs),
              "{} --resume: {} is at step {} with {} instances read, past train.max_epochs={}: "
              "raise train.max_epochs to continue the run",
              tag, checkpoint, state.step, state.data_cursor, tc.max_epochs);
    return changed ? max_steps_for_epochs(config, *dataset, state.step, position.cursor)
                   : max_steps_for_epochs(config, *dataset, state.origin.step,
                                          state.origin.data_cursor);
  }
  return tc.max_steps;
}

namespace {

// OLMo-core's loader state at the checkpoint `state`, under the saved run's epochs of
// `epoch_length` instances of `seq_len` tokens: the epoch of the last instance read (at an
// epoch's end the one that ended: OLMo-core checkpoints before it resets) and the tokens read of
// it; in the epoch where a moved position started (the replay origin's), counted on from the
// tokens recorded there, which may include some that filled no whole batch.
struct LoaderState {
  uint64_t epoch = 1;
  int64_t tokens = 0;
};

LoaderState olmo_core_loader_state(const TrainerState& state, uint64_t epoch_length,
                                   int64_t seq_len) {
  const ReplayOrigin& o = state.origin;
  const uint64_t cursor = state.data_cursor;
  if (o.epoch > 0 && cursor == o.data_cursor) return {o.epoch, o.epoch_tokens};
  if (cursor == 0) return {};
  const uint64_t epoch = (cursor - 1) / epoch_length + 1;
  // Below 2^62 instances of a file's tokens (trainer_state.h's checks): no overflow.
  if (o.epoch == epoch)
    return {epoch, o.epoch_tokens + static_cast<int64_t>(cursor - o.data_cursor) * seq_len};
  return {epoch, static_cast<int64_t>(cursor - (epoch - 1) * epoch_length) * seq_len};
}

}  // namespace

ResumePosition resume_position(const RunConfig& saved, const TrainerState& state,
                               const std::string& checkpoint, const RunConfig& config,
                               int64_t instances) {
  const TrainConfig &was = saved.train, &now = config.train;
  ResumePosition position{.cursor = state.data_cursor};
  if (saved.data.order != data::OrderRule::kOlmoCore ||
      config.data.order != data::OrderRule::kOlmoCore)
    return position;
  // OLMo-core's loader keeps the checkpoint's data seed (its load_state_dict), which would leave
  // train.seed without effect on the order: refused rather than ignored.
  MOE_CHECK(was.seed == now.seed,
            "[train] --resume: train.seed: {} -> {} under data.order = \"olmo-core\", whose "
            "loader keeps the checkpoint's data seed; keep train.seed={}",
            was.seed, now.seed, was.seed);
  // OLMo-core's loader refuses it too: the instances would be cut from other blocks.
  MOE_CHECK(saved.data.max_target_seq_len == config.data.max_target_seq_len,
            "[train] --resume: data.max_target_seq_len: {} -> {} under data.order = "
            "\"olmo-core\", whose loader cannot restore a position in other blocks; keep "
            "data.max_target_seq_len={}",
            saved.data.max_target_seq_len, config.data.max_target_seq_len,
            saved.data.max_target_seq_len);
  const bool resized = was.batch_size != now.batch_size || was.seq_len != now.seq_len;
  MOE_CHECK(!resized || was.seq_len == now.seq_len || state.train_data.has_value(),
            "[train] --resume: {} does not record its training set's instances (an older "
            "moecore wrote it), which data.order = \"olmo-core\" needs to move its data position "
            "to train.seq_len={}; keep train.seq_len={}",
            checkpoint, now.seq_len, was.seq_len);
  // The saved run's instances: as this run's under the same seq_len, unless its contents changed.
  const int64_t saved_instances = state.train_data ? state.train_data->instances : instances;
  const auto old_epoch = static_cast<uint64_t>(epoch_length(saved, saved_instances));
  const int64_t new_epoch = epoch_length(config, instances);
  // A replay origin's epoch must hold its cursor (at its start, inside it, or at its end): one
  // that does not would move the position silently.
  const ReplayOrigin& o = state.origin;
  MOE_CHECK(o.epoch == 0 || o.data_cursor / old_epoch + 1 == o.epoch ||
                (o.data_cursor / old_epoch == o.epoch && o.data_cursor % old_epoch == 0),
            "[checkpoint] {}: replay_origin.epoch={} does not hold replay_origin.data_cursor={} "
            "(epochs of {} instances)",
            checkpoint, o.epoch, o.data_cursor, old_epoch);
  const LoaderState loader = olmo_core_loader_state(state, old_epoch, was.seq_len);
  // As OLMo-core's load_state_dict: batches_processed = tokens_processed // global batch tokens;
  // past the epoch's last whole batch its loader yields nothing and the next epoch follows.
  const int64_t batches =
      std::min(loader.tokens / (now.batch_size * now.seq_len), new_epoch / now.batch_size);
  position.epoch = loader.epoch;
  position.offset = batches * now.batch_size;
  position.epoch_length = new_epoch;
  position.tokens_read = loader.tokens;
  const bool fits = !__builtin_mul_overflow(loader.epoch - 1, static_cast<uint64_t>(new_epoch),
                                            &position.cursor) &&
                    !__builtin_add_overflow(position.cursor, static_cast<uint64_t>(position.offset),
                                            &position.cursor);
  MOE_CHECK(fits,
            "[train] --resume: {}: epoch {} of {} instances, from train.batch_size={} and the "
            "training set's {} instances, does not fit a data position",
            checkpoint, loader.epoch, new_epoch, now.batch_size, instances);
  position.moved = resized || position.cursor != state.data_cursor;
  // The instances of the epoch the saved run had read past the new position (same instances:
  // the same seq_len's); none where the new batches have read the epoch (the next one follows).
  const uint64_t epoch_start = (loader.epoch - 1) * old_epoch;
  if (was.seq_len == now.seq_len && state.data_cursor > epoch_start && position.offset < new_epoch)
    position.read_again = std::max<int64_t>(
        0, static_cast<int64_t>(state.data_cursor - epoch_start) - position.offset);
  return position;
}

OlmoCoreEpochPosition olmo_core_epoch_position(const RunConfig& config, const TrainerState& state,
                                               int64_t instances) {
  const TrainConfig& t = config.train;
  const int64_t epoch = epoch_length(config, instances);
  const LoaderState loader = olmo_core_loader_state(state, static_cast<uint64_t>(epoch), t.seq_len);
  const int64_t batches = loader.tokens / (t.batch_size * t.seq_len);
  return {batches, batches >= epoch / t.batch_size};
}

ReplayOrigin resumed_replay_origin(const TrainerState& state, bool changed,
                                   const ResumePosition& position) {
  if (!changed) return state.origin;
  return {state.step, position.cursor, state.tokens_seen, position.epoch, position.tokens_read};
}

std::string describe_resume_position(const RunConfig& saved, const RunConfig& config,
                                     const ResumePosition& position) {
  const TrainConfig &was = saved.train, &now = config.train;
  std::vector<std::string> changes;
  if (was.batch_size != now.batch_size)
    changes.push_back(fmt::format("train.batch_size {} -> {}", was.batch_size, now.batch_size));
  if (was.seq_len != now.seq_len)
    changes.push_back(fmt::format("train.seq_len {} -> {}", was.seq_len, now.seq_len));
  // Neither: the training set's contents changed, and its epochs with them.
  const std::string changed =
      changes.empty() ? "another training set" : fmt::format("{}", fmt::join(changes, " and "));
  const std::string after =
      was.seq_len != now.seq_len
          ? "the instances are cut anew"
          : fmt::format("{} instance(s) read before are read again", position.read_again);
  const std::string where =
      position.offset == position.epoch_length
          ? fmt::format("at the start of epoch {}", position.epoch + 1)
          : fmt::format("in epoch {} at instance {} of its {}", position.epoch, position.offset,
                        position.epoch_length);
  // The whole batches the tokens fill, which may be more than the epoch has (then it is over).
  const int64_t filled = position.tokens_read / (now.batch_size * now.seq_len);
  return fmt::format(
      "note: data.order = \"olmo-core\" with {}: the run goes on {} (as OLMo-core's loader: the "
      "{} tokens read in epoch {} fill {} global batch(es) of {} x {} tokens; {})",
      changed, where, position.tokens_read, position.epoch, filled, now.batch_size, now.seq_len,
      after);
}

}  // namespace moecore
