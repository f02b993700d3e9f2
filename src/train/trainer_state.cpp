#include "train/trainer_state.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "io/json_excerpt.h"

namespace moecore {

namespace {

using nlohmann::json;

// Far beyond any run (2^40 steps, 2^62 instances or tokens) and far inside int64, so products of
// two checked fields cannot overflow unnoticed.
constexpr int64_t kMaxStep = int64_t{1} << 40;
constexpr int64_t kMaxCount = int64_t{1} << 62;

const json& member(const json& object, const char* key, const std::string& origin,
                   const std::string& where) {
  MOE_CHECK(object.is_object() && object.contains(key), "[checkpoint] {}: {}{} is missing", origin,
            where, key);
  return object[key];
}

int64_t integer_in(const json& object, const char* key, int64_t max, const std::string& origin,
                   const std::string& where = "") {
  const json& value = member(object, key, origin, where);
  MOE_CHECK(value.is_number_integer(), "[checkpoint] {}: {}{}={} must be an integer", origin, where,
            key, json_excerpt(value));
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(max)
                            : value.get<int64_t>() >= 0 && value.get<int64_t>() <= max;
  MOE_CHECK(in_range, "[checkpoint] {}: {}{}={} is out of range [0, {}]", origin, where, key,
            json_excerpt(value), max);
  return value.get<int64_t>();
}

// A window of a guard or detector: an array of finite numbers, at most `max_size` long.
void check_window(const json& object, const char* key, size_t max_size, const std::string& origin,
                  const std::string& where) {
  const json& window = member(object, key, origin, where);
  MOE_CHECK(window.is_array(), "[checkpoint] {}: {}{} must be an array of numbers", origin, where,
            key);
  MOE_CHECK(window.size() <= max_size,
            "[checkpoint] {}: {}{} holds {} values, more than its window of {}", origin, where, key,
            window.size(), max_size);
  for (const json& v : window)
    MOE_CHECK(v.is_number() && std::isfinite(v.get<double>()),
              "[checkpoint] {}: {}{} holds {}, not a finite number", origin, where, key,
              json_excerpt(v));
}

}  // namespace

TrainerState parse_trainer_state(std::string_view text, const std::string& origin,
                                 const TrainConfig& written_by) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail("[checkpoint] {}: not valid JSON: {}", origin, e.what());
  }
  MOE_CHECK(doc.is_object(), "[checkpoint] {}: the top level is a JSON {}, expected an object",
            origin, doc.type_name());
  TrainerState state;
  state.step = integer_in(doc, "step", kMaxStep, origin);
  state.tokens_seen = integer_in(doc, "tokens_seen", kMaxCount, origin);
  state.data_cursor = static_cast<uint64_t>(integer_in(doc, "data_cursor", kMaxCount, origin));
  const json& seed = member(doc, "seed", origin, "");
  MOE_CHECK(seed.is_number_unsigned(), "[checkpoint] {}: seed={} must be an integer in [0, 2^64)",
            origin, json_excerpt(seed));
  state.seed = seed.get<uint64_t>();
  MOE_CHECK(state.seed == written_by.seed,
            "[checkpoint] {}: seed={} differs from train.seed={} of the run that wrote it", origin,
            state.seed, written_by.seed);
  if (doc.contains("checksums")) {
    MOE_CHECK(doc["checksums"] == kChecksumsFile, "[checkpoint] {}: checksums={} must be \"{}\"",
              origin, json_excerpt(doc["checksums"]), kChecksumsFile);
    state.has_checksums = true;
  }
  if (doc.contains("recipe_revision"))
    state.recipe_revision = integer_in(doc, "recipe_revision", kRecipeRevision, origin);
  if (doc.contains("train_data")) {
    const json& d = doc["train_data"];
    data::DatasetFingerprint fingerprint;
    fingerprint.tokens = integer_in(d, "tokens", kMaxCount, origin, "train_data.");
    fingerprint.instances = integer_in(d, "instances", kMaxCount, origin, "train_data.");
    // Instances are cut from the tokens: more of them than the tokens fill is damage (and the
    // products of the two below stay in range).
    MOE_CHECK(fingerprint.instances <= fingerprint.tokens / written_by.seq_len,
              "[checkpoint] {}: train_data.instances={} of train.seq_len={} tokens exceed "
              "train_data.tokens={}",
              origin, fingerprint.instances, written_by.seq_len, fingerprint.tokens);
    const json& hash = member(d, "sample_hash", origin, "train_data.");
    const std::string hex = hash.is_string() ? hash.get<std::string>() : std::string();
    MOE_CHECK(hex.size() == 16 &&
                  std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(c) != 0; }),
              "[checkpoint] {}: train_data.sample_hash={} must be 16 hex digits", origin,
              json_excerpt(hash));
    fingerprint.sample_hash = std::stoull(hex, nullptr, 16);
    state.train_data = fingerprint;
  }
  if (doc.contains("threads")) state.threads = integer_in(doc, "threads", kMaxCount, origin);
  if (doc.contains("eval_pending")) {
    MOE_CHECK(doc["eval_pending"].is_boolean(),
              "[checkpoint] {}: eval_pending={} must be a boolean", origin,
              json_excerpt(doc["eval_pending"]));
    state.eval_pending = doc["eval_pending"].get<bool>();
  }
  if (doc.contains("replay_origin")) {
    const json& o = doc["replay_origin"];
    state.origin.step = integer_in(o, "step", kMaxStep, origin, "replay_origin.");
    state.origin.data_cursor =
        static_cast<uint64_t>(integer_in(o, "data_cursor", kMaxCount, origin, "replay_origin."));
    state.origin.tokens_seen = integer_in(o, "tokens_seen", kMaxCount, origin, "replay_origin.");
    if (o.contains("epoch")) {
      const int64_t epoch = integer_in(o, "epoch", kMaxCount, origin, "replay_origin.");
      MOE_CHECK(epoch >= 1, "[checkpoint] {}: replay_origin.epoch=0 must be at least 1", origin);
      state.origin.epoch = static_cast<uint64_t>(epoch);
      state.origin.epoch_tokens =
          integer_in(o, "epoch_tokens", kMaxCount, origin, "replay_origin.");
    }
    MOE_CHECK(state.origin.step <= state.step,
              "[checkpoint] {}: replay_origin.step={} is after step={}", origin, state.origin.step,
              state.step);
  }
  if (doc.contains("batch_size_history")) {
    // Each a size of the writer's schedule, the first its train.batch_size, neighbours differing.
    const json& history = doc["batch_size_history"];
    MOE_CHECK(history.is_array() && !history.empty(),
              "[checkpoint] {}: batch_size_history={} must be a non-empty array of batch sizes",
              origin, json_excerpt(history));
    const std::vector<int64_t>& sizes = written_by.batch_sizes;
    for (const json& entry : history) {
      const int64_t size =
          integer_in(json{{"size", entry}}, "size", kMaxCount, origin, "batch_size_history's ");
      MOE_CHECK(std::find(sizes.begin(), sizes.end(), size) != sizes.end() &&
                    (!state.batch_size_history.empty() || size == written_by.batch_size) &&
                    (state.batch_size_history.empty() || size != state.batch_size_history.back()),
                "[checkpoint] {}: batch_size_history={} is not a history of train.batch_sizes "
                "from train.batch_size={} of the run that wrote it",
                origin, json_excerpt(history), written_by.batch_size);
      state.batch_size_history.push_back(size);
    }
  }
  // Every step since the replay origin reads the batch in force, batch_size instances of seq_len
  // tokens (skipped steps too; a change of the batch size starts a new origin), so the cursor and
  // the token count follow from the step. An overflow counts as a mismatch.
  const int64_t batch_size = state.batch_size_in_force(written_by);
  const int64_t steps = state.step - state.origin.step;
  int64_t cursor = 0, per_step_tokens = 0, tokens = 0;
  const bool cursor_ok =
      !__builtin_mul_overflow(steps, batch_size, &cursor) &&
      !__builtin_add_overflow(cursor, static_cast<int64_t>(state.origin.data_cursor), &cursor) &&
      cursor == static_cast<int64_t>(state.data_cursor);
  MOE_CHECK(cursor_ok,
            "[checkpoint] {}: data_cursor={} does not match step={} x train.batch_size={} of the "
            "run that wrote it",
            origin, state.data_cursor, state.step, batch_size);
  const bool tokens_ok =
      !__builtin_mul_overflow(batch_size, written_by.seq_len, &per_step_tokens) &&
      !__builtin_mul_overflow(steps, per_step_tokens, &tokens) &&
      !__builtin_add_overflow(tokens, state.origin.tokens_seen, &tokens) &&
      tokens == state.tokens_seen;
  MOE_CHECK(tokens_ok,
            "[checkpoint] {}: tokens_seen={} does not match step={} x train.batch_size={} x "
            "train.seq_len={} of the run that wrote it",
            origin, state.tokens_seen, state.step, batch_size, written_by.seq_len);

  state.step_guard = member(doc, "step_guard", origin, "");
  const auto window = static_cast<size_t>(written_by.skip_window);
  check_window(state.step_guard, "losses", window, origin, "step_guard.");
  check_window(state.step_guard, "grad_norms", window, origin, "step_guard.");
  const int64_t skipped = integer_in(state.step_guard, "skipped", kMaxStep, origin, "step_guard.");
  MOE_CHECK(skipped <= state.step, "[checkpoint] {}: step_guard.skipped={} exceeds step={}", origin,
            skipped, state.step);
  if (state.step_guard.contains("consecutive")) {  // absent in older moecore's checkpoints
    const int64_t consecutive =
        integer_in(state.step_guard, "consecutive", kMaxStep, origin, "step_guard.");
    MOE_CHECK(consecutive <= skipped,
              "[checkpoint] {}: step_guard.consecutive={} exceeds step_guard.skipped={}", origin,
              consecutive, skipped);
  }
  if (state.step_guard.contains("last_reason"))
    MOE_CHECK(state.step_guard["last_reason"].is_string(),
              "[checkpoint] {}: step_guard.last_reason must be a string", origin);
  state.gerrymandering = member(doc, "gerrymandering", origin, "");
  // Checkpoints of a diverged run written before the detector left non-finite steps out hold
  // them as null (JSON has no NaN): such steps are dropped from both windows, as the detector
  // now drops them, so those runs resume.
  if (state.gerrymandering.is_object() && state.gerrymandering.contains("lb") &&
      state.gerrymandering.contains("imbalance") && state.gerrymandering["lb"].is_array() &&
      state.gerrymandering["imbalance"].is_array() &&
      state.gerrymandering["lb"].size() == state.gerrymandering["imbalance"].size()) {
    json lb = json::array(), imbalance = json::array();
    for (size_t i = 0; i < state.gerrymandering["lb"].size(); ++i) {
      const json& l = state.gerrymandering["lb"][i];
      const json& m = state.gerrymandering["imbalance"][i];
      if (l.is_null() || m.is_null()) continue;
      lb.push_back(l);
      imbalance.push_back(m);
    }
    state.gerrymandering["lb"] = std::move(lb);
    state.gerrymandering["imbalance"] = std::move(imbalance);
  }
  // The detector keeps its window even when it is off (window 0), so no length bound here.
  check_window(state.gerrymandering, "lb", std::numeric_limits<size_t>::max(), origin,
               "gerrymandering.");
  check_window(state.gerrymandering, "imbalance", std::numeric_limits<size_t>::max(), origin,
               "gerrymandering.");
  MOE_CHECK(state.gerrymandering["lb"].size() == state.gerrymandering["imbalance"].size(),
            "[checkpoint] {}: gerrymandering.lb and gerrymandering.imbalance differ in length",
            origin);
  const json& flagged = member(state.gerrymandering, "flagged", origin, "gerrymandering.");
  MOE_CHECK(flagged.is_boolean(), "[checkpoint] {}: gerrymandering.flagged={} must be a boolean",
            origin, json_excerpt(flagged));
  if (doc.contains("spike_monitor")) {  // absent in older moecore's checkpoints
    state.spike_monitor = doc["spike_monitor"];
    MOE_CHECK(state.spike_monitor.is_object(), "[checkpoint] {}: spike_monitor must be an object",
              origin);
    const size_t unbounded = std::numeric_limits<size_t>::max();
    check_window(state.spike_monitor, "losses", unbounded, origin, "spike_monitor.");
    check_window(state.spike_monitor, "grad_norms", unbounded, origin, "spike_monitor.");
    const json& spikes = member(state.spike_monitor, "spikes", origin, "spike_monitor.");
    MOE_CHECK(spikes.is_array(), "[checkpoint] {}: spike_monitor.spikes must be an array", origin);
    for (const json& s : spikes)
      MOE_CHECK(s.is_boolean(), "[checkpoint] {}: spike_monitor.spikes holds {}, not a boolean",
                origin, json_excerpt(s));
    const int64_t observed =
        integer_in(state.spike_monitor, "total_steps", kMaxStep, origin, "spike_monitor.");
    const int64_t spiked =
        integer_in(state.spike_monitor, "total_spikes", kMaxStep, origin, "spike_monitor.");
    MOE_CHECK(spiked <= observed,
              "[checkpoint] {}: spike_monitor.total_spikes={} exceeds total_steps={}", origin,
              spiked, observed);
  }
  return state;
}

TrainerState load_trainer_state(const std::string& checkpoint_dir, const TrainConfig& written_by) {
  const std::string path = checkpoint_dir + "/trainer_state.json";
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[checkpoint] cannot read '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_trainer_state(text.str(), path, written_by);
}

SavedRun load_saved_run(const std::string& checkpoint_dir, const char* tag) {
  MOE_CHECK(std::filesystem::is_regular_file(checkpoint_dir + "/trainer_state.json"),
            "{} --resume {} is not a checkpoint directory (no trainer_state.json)", tag,
            checkpoint_dir);
  SavedRun run{load_run_config(checkpoint_dir + "/config.toml", {}, {}, ScheduleLength::kResumed),
               {}};
  run.state = load_trainer_state(checkpoint_dir, run.config.train);
  return run;
}

}  // namespace moecore
