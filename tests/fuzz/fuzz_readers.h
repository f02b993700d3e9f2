// What each fuzz target does with one input, shared by the libFuzzer targets (fuzz_*.cpp, clang +
// sanitizers) and by the regression test that `make test` runs on every kept finding
// (tests/cpp/test_fuzz_regressions.cpp, the normal GCC build). A reader passes an input when it
// returns or throws a std::exception (moecore::Error, or a library's parse error it lets through).
// A broken invariant of an accepted input throws Finding, which is deliberately not a
// std::exception, so no reader's catch can swallow it. Crashes, sanitizer reports, hangs and
// allocations beyond libFuzzer's -malloc_limit_mb are findings too.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "data/icl_task.h"
#include "data/npy.h"
#include "data/tokenizer.h"
#include "data/tokenizer_byte_level.h"
#include "io/hf_config.h"
#include "io/hf_config_reader.h"
#include "io/safetensors.h"
#include "train/gerrymandering.h"
#include "train/icl_metric.h"
#include "train/run_config.h"
#include "train/step_guard.h"
#include "train/trainer_state.h"

namespace moecore::fuzz {

struct Finding {
  std::string what;
};

// model.safetensors, optim.safetensors, checkpoint parts: every tensor the header declares is read
// back, so data_offsets, shapes and dtypes are exercised as a checkpoint load would.
inline void read_safetensors(const std::string& path) {
  const auto reader = io::SafetensorsReader::open(path);
  for (const std::string& name : reader.names()) {
    const std::vector<float> values = reader.read_f32(name);
    const io::TensorInfo& info = reader.info(name);
    int64_t numel = 1;
    for (int64_t d : info.shape) numel *= d;
    if (static_cast<int64_t>(values.size()) != numel) throw Finding{"read_f32 size != shape"};
  }
}

// Token files with a NumPy header, debug-state inputs: integer arrays read in full, element by
// element and in bulk, as the data loader and the debug commands do.
inline void read_npy(const std::string& path) {
  const auto npy = data::NpyFile::open(path);
  const std::string& d = npy.dtype();
  if (d.size() > 1 && (d[1] == 'u' || d[1] == 'i')) {
    std::vector<int64_t> all;
    npy.read_ints(all);
    if (all.size() != npy.numel()) throw Finding{"read_ints size != numel"};
    if (!all.empty() && npy.int_at(all.size() - 1) != all.back())
      throw Finding{"int_at disagrees with read_ints"};
  }
}

// tokenizer.json given by the user or found in a checkpoint. One that loads is also used: encode
// of a text covering the byte classes the GPT-2 regex splits on (and an added token, a control
// byte, text NFC changes: a combining accent and U+212A), decode of the result and of every id
// below vocab_size (capped), and the EOS look-up, so a vocabulary that loads but cannot serve is
// found too. Text that is not UTF-8 must be refused by every tokenizer that loads.
inline void read_tokenizer(std::string_view text) {
  const auto tok = data::Tokenizer::from_json(text, "fuzz.json");
  static constexpr std::string_view kSample =
      "The Lord's 12 sheep, \xc3\xa9te\xcc\x81!  \n\t<|endoftext|>x\x01\xe2\x84\xaa";
  bool refused = false;
  try {
    (void)tok.encode("x\xff");
  } catch (const std::exception&) {
    refused = true;
  }
  if (!refused) throw Finding{"encode accepted text that is not UTF-8"};
  const std::vector<int32_t> ids = tok.encode(kSample);
  (void)tok.decode(ids);
  (void)tok.decode_text(ids);
  std::vector<int32_t> every(static_cast<size_t>(std::clamp<int64_t>(tok.vocab_size(), 0, 4096)));
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int32_t>(i);
  (void)tok.decode(every);
  (void)tok.eos_id();
}

// The TOML run configuration (also read back from every checkpoint's config.toml). One that
// parses must survive its own round trip: the TOML written into out_dir and every checkpoint
// parses again to the same model, else a run could start that can never be resumed.
inline void read_run_config(const std::string& text) {
  const RunConfig config = parse_run_config(text, "fuzz.toml");
  const std::string saved = run_config_to_toml(config);
  RunConfig again;
  try {
    again = parse_run_config(saved, "saved.toml");
  } catch (const std::exception& e) {
    throw Finding{std::string("accepted, but its saved form is refused: ") + e.what()};
  }
  const std::string difference = model_config_difference(again.model, config.model);
  if (!difference.empty()) throw Finding{"saved form differs: " + difference};
}

// trainer_state.json as a resume reads it (train/trainer.cpp): the validating parser, then the
// step guard's and the gerrymandering detector's windows. `written_by` stands for the [train] table
// saved beside the state, that of the run the corpus files come from (8 x 64 tokens a step, seed
// 0): the cross-checks against it are part of what is fuzzed.
inline TrainConfig trainer_state_corpus_config() {
  TrainConfig c;
  c.batch_size = 8;
  c.seq_len = 64;
  c.seed = 0;
  return c;
}

inline void read_trainer_state(std::string_view text) {
  const TrainConfig written_by = trainer_state_corpus_config();
  const TrainerState state = parse_trainer_state(text, "trainer_state.json", written_by);
  StepGuard guard({written_by.skip_sigma, written_by.skip_window, written_by.skip_min_window});
  guard.from_json(state.step_guard);
  GerrymanderingDetector detector(
      {written_by.gerrymander_window, written_by.gerrymander_threshold});
  detector.from_json(state.gerrymandering);
}

// config.json of a Hugging Face model directory (`import`, `train --init-from`): JSON parse, then
// the family's keys into a ModelConfig. An accepted config must survive the round trip `import`
// makes: moecore's export of it (io/hf_config.h) reads back as the same architecture.
inline void read_hf_config(std::string_view text) {
  const nlohmann::json config = nlohmann::json::parse(text);
  const io::HfModelConfig read = io::hf_model_config_from_json(config, "config.json");
  const nlohmann::json exported = io::hf_config_json(read.model, 2048, std::nullopt);
  io::HfModelConfig again;
  try {
    again = io::hf_model_config_from_json(exported, "exported config.json");
  } catch (const std::exception& e) {
    throw Finding{std::string("moecore's export of an accepted config.json is refused: ") +
                  e.what()};
  }
  const std::string difference = model_config_difference(io::canonical_architecture(again.model),
                                                         io::canonical_architecture(read.model));
  if (!difference.empty()) throw Finding{"export round trip changed the model: " + difference};
}

// A byte-level tokenizer without merges (every byte one token, <|endoftext|> added): what the
// downstream requests are tokenized with below.
inline const data::Tokenizer& byte_tokenizer() {
  static const data::Tokenizer tokenizer = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[data::byte_level_chars()[static_cast<size_t>(b)]] = b;
    const nlohmann::json added = {
        {"id", 256},       {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
        {"rstrip", false}, {"normalized", false},        {"special", true}};
    const nlohmann::json json = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array({added})},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    return data::Tokenizer::from_json(json.dump(), "fuzz byte tokenizer");
  }();
  return tokenizer;
}

// oe-eval downstream requests (requests.jsonl, plain or gzip; data/icl_task.h) in the task
// directory `dir`, read as the trainer and `moecore eval-downstream` read them, once for a metric
// with integer labels (acc) and once for a gold-only one (bpb), with a BOS token and a context
// length of 16. An accepted task's samples must fit their queries (every scored position inside
// the query, the query within the context length), and its metrics must compute on any scores.
// Rejected under both metrics: the last error propagates.
inline void read_icl_requests_in(const std::string& dir) {
  constexpr int64_t kContext = 16;
  bool accepted = false;
  std::string rejected;
  // acc and bpb as requests, and acc as fast multiple choice (one query a document).
  for (const auto& [metric, fast_mc] : {std::pair{"acc", false}, {"bpb", false}, {"acc", true}}) {
    std::optional<data::IclTask> task;
    try {
      task = data::load_icl_task({dir, "fuzz", metric, fast_mc}, byte_tokenizer(), 256, kContext);
    } catch (const std::exception& e) {
      rejected = e.what();
      continue;
    }
    if (task->samples.empty() || task->documents < 1) throw Finding{"accepted without samples"};
    for (size_t i = 0; i < task->samples.size(); ++i) {
      const data::IclSample& s = task->samples[i];
      if (s.shared_query >= 0 &&
          (!fast_mc || static_cast<size_t>(s.shared_query) >= i ||
           task->samples[static_cast<size_t>(s.shared_query)].doc_id != s.doc_id ||
           task->samples[static_cast<size_t>(s.shared_query)].query != s.query ||
           s.continuation.size() != 1))
        throw Finding{"a choice shares no earlier query of its document"};
      const auto cont = static_cast<int64_t>(s.continuation.size());
      const auto query = static_cast<int64_t>(s.query.size());
      if (cont < 1 || query > kContext || s.ctx_len < 1 || s.ctx_len - 1 + cont > query)
        throw Finding{"a sample's continuation does not fit its query"};
      if (s.dc_len < 1 || s.dc_len - 1 + cont > static_cast<int64_t>(s.dc_query.size()))
        throw Finding{"a sample's continuation does not fit its domain-conditional query"};
      if (s.cont_str_len < 1 || s.cont_byte_len < s.cont_str_len ||
          s.cont_byte_len_no_leading_space > s.cont_byte_len - 1)
        throw Finding{"a continuation's lengths disagree"};
    }
    const std::vector<IclScore> scores(task->samples.size(), IclScore{-1.0, -2.0});
    try {
      (void)compute_icl_metrics(*task, scores);
    } catch (const Error&) {
      // A label outside its document's continuations: refused with a one-line error.
    }
    accepted = true;
  }
  if (!accepted) throw Error(rejected);
}

// The same for a file of requests: copied into a scratch task directory (one per process) as
// requests.jsonl.gz, which the reader inflates when it is gzip and reads as it is otherwise.
inline void read_icl_requests(const std::string& file) {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moecore-fuzz-icl-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(file, dir / "requests.jsonl.gz",
                             std::filesystem::copy_options::overwrite_existing);
  read_icl_requests_in(dir.string());
}

}  // namespace moecore::fuzz
