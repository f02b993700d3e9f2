#include "cli/job_commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "cli/distinct_paths.h"
#include "core/check.h"
#include "data/bpe_trainer.h"
#include "data/icl_task.h"
#include "data/instance_filter.h"
#include "data/npy.h"
#include "data/prepare_corpus.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "data/tokenizer_byte_level.h"
#include "io/file_checksums.h"
#include "io/file_util.h"
#include "io/hf_config_reader.h"
#include "io/hf_side_files.h"
#include "io/model_weights.h"
#include "model/document_mask.h"
#include "model/transformer.h"
#include "train/batch_size_schedule.h"
#include "train/downstream_eval.h"
#include "train/evaluate.h"
#include "train/lm_evaluator.h"
#include "train/resume_policy.h"
#include "train/run_config.h"
#include "train/sample.h"
#include "train/trainer_state.h"
#include "train/training_data.h"

namespace moecore::cli {

namespace {

std::string read_file(const std::string& path) {
  MOE_CHECK(std::filesystem::is_regular_file(path), "[cli] cannot read '{}' (not a file)", path);
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[cli] cannot open '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A checkpoint directory's configuration and weights.
struct LoadedModel {
  RunConfig config;
  ParamLayout layout;
  ParamBuffers params;
};

LoadedModel load_model(const std::string& dir) {
  MOE_CHECK(std::filesystem::is_directory(dir), "[cli] checkpoint '{}' is not a directory", dir);
  // As a resume does: every file as it was written (one written before checksums: as it is).
  io::verify_checksums(dir, kChecksumsFile, "[cli]");
  RunConfig config = parse_run_config(read_file(dir + "/config.toml"), dir + "/config.toml", {}, {},
                                      ScheduleLength::kResumed);
  ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  io::load_weights_from_dir(layout, dir, params);
  io::require_finite_weights(
      layout, params, [&dir](const std::string&) { return dir; }, "[cli]");
  return {std::move(config), std::move(layout), std::move(params)};
}

}  // namespace

void run_tokenizer_train(const std::vector<std::string>& inputs, int64_t vocab_size,
                         const std::string& out) {
  std::vector<NamedPath> named;
  for (const std::string& input : inputs) named.push_back({"--input", input});
  check_outputs_apart(named, {{"--out", out}});
  for (const std::string& input : inputs)
    MOE_CHECK(std::filesystem::is_regular_file(input), "[tokenizer] input '{}' is not a file",
              input);
  const data::Tokenizer tokenizer = data::train_bpe(inputs, vocab_size, {"<|endoftext|>"});
  tokenizer.save(out);
  fmt::print("tokenizer: {} tokens -> {}\n", tokenizer.vocab_size(), out);
}

void run_tokenizer_encode(const std::string& tokenizer_path, const std::string& input,
                          const std::string& out) {
  check_outputs_apart({{"--tokenizer", tokenizer_path}, {"--input", input}}, {{"--out", out}});
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  const std::string text = read_file(input);
  // As prepare and tokenizer train name it (the library's own check cannot name the file).
  const size_t invalid = data::utf8_invalid_offset(text);
  MOE_CHECK(invalid == std::string::npos, "[tokenizer] {}: not UTF-8 at byte {}", input, invalid);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  const std::vector<uint32_t> wide(ids.begin(), ids.end());
  data::write_npy(out, "<u4", {static_cast<int64_t>(wide.size())}, wide.data());
}

void run_prepare(const PrepareArgs& args) {
  const data::Tokenizer tokenizer = data::Tokenizer::load(args.tokenizer);
  data::PrepareOptions options;
  options.overwrite = args.overwrite;
  options.tokenizer_path = args.tokenizer;
  options.dtype = args.dtype;
  options.npy_header = args.npy_header;
  const data::PrepareStats stats = data::prepare_corpus(
      args.inputs, [&](std::string_view text) { return tokenizer.encode(text); },
      tokenizer.eos_id(), tokenizer.vocab_size(), args.out, args.val_fraction, options);
  fmt::print("prepare: {} train documents ({} tokens), {} val documents ({} tokens), {} {} -> {}\n",
             stats.train_documents, stats.train_tokens, stats.val_documents, stats.val_tokens,
             stats.dtype, args.npy_header ? ".npy files" : "headerless (OLMo-core) files",
             args.out);
}

void run_eval(const std::string& checkpoint, const std::vector<std::string>& data,
              int64_t max_instances, const std::string& dtype,
              const std::vector<std::string>& label_mask) {
  LoadedModel m = load_model(checkpoint);
  MOE_CHECK(dtype.empty() || !data::token_dtype_descr(dtype).empty(),
            "[eval] --dtype '{}' is not one of uint16, uint32, int32, int64", dtype);
  const data::TokenDataset dataset =
      data::TokenDataset::open(data, m.config.train.seq_len, m.config.model.vocab_size,
                               dtype.empty() ? m.config.data.dtype : dtype, 0, label_mask);
  Transformer model(m.config.model, m.layout);
  // Scored as the checkpoint was trained: in its train.precision (the trainer's validation loss,
  // which a run stopped by a signal skipped, is this one), with its document masking, if any.
  model.set_precision(PrecisionRecipe::from_train(m.config.train.precision, m.config.train.mxfp8));
  model.set_document_masking(document_masking_eos(m.config.data, dataset),
                             document_masking_bos(m.config.data));
  const int64_t rows = m.config.train.batch_size / m.config.train.microbatches;
  const EvalResult r = evaluate(model, m.params, dataset, rows, max_instances);
  fmt::print("eval: loss {:.4f}  perplexity {:.3f}  ({} instances, {} tokens)\n", r.loss,
             r.perplexity, r.instances, r.tokens);
}

void run_data_instances(const DataInstancesArgs& args) {
  std::vector<NamedPath> data;
  for (const std::string& path : args.data) data.push_back({"--data", path});
  check_outputs_apart(data, {{"--out", args.out}, {"--doc-lens-out", args.doc_lens_out}});
  MOE_CHECK(args.seq_len >= 1, "[data] --seq-len={} must be positive", args.seq_len);
  MOE_CHECK(data::is_max_target_seq_len(args.max_target_seq_len, args.seq_len),
            "[data] --max-target-seq-len={} must be 0 (none) or a positive multiple of "
            "--seq-len={}",
            args.max_target_seq_len, args.seq_len);
  MOE_CHECK(args.dtype.empty() || !data::token_dtype_descr(args.dtype).empty(),
            "[data] --dtype '{}' is not one of uint16, uint32, int32, int64", args.dtype);
  const data::TokenDataset dataset =
      data::TokenDataset::open(args.data, args.seq_len, args.vocab_size, args.dtype,
                               args.max_target_seq_len, args.label_mask);
  const int64_t n = args.max_instances > 0 ? std::min(args.max_instances, dataset.num_instances())
                                           : dataset.num_instances();
  const int64_t T = args.seq_len;
  std::vector<int32_t> row(static_cast<size_t>(T));
  std::vector<int64_t> instances(static_cast<size_t>(n * T));
  const int64_t eos = args.eos_id >= 0 ? args.eos_id : dataset.metadata_eos_id();
  // As data.eos_id in a config: a token id of the vocabulary.
  MOE_CHECK(eos < args.vocab_size, "[data] --eos-id={} is outside [0, --vocab-size={})", eos,
            args.vocab_size);
  MOE_CHECK(args.bos_id < args.vocab_size, "[data] --bos-id={} is outside [0, --vocab-size={})",
            args.bos_id, args.vocab_size);
  MOE_CHECK(args.bos_id < 0 || !args.doc_lens_out.empty(),
            "[data] --bos-id only says where documents end for --doc-lens-out");
  MOE_CHECK(!args.repetition_given || !args.instance_mask_out.empty(),
            "[data] --repetition-* set the instance filter, which only --instance-mask-out runs");
  MOE_CHECK(args.repetition.max_period >= args.repetition.min_period,
            "[data] --repetition-max-period={} is below --repetition-min-period={}",
            args.repetition.max_period, args.repetition.min_period);
  std::vector<uint8_t> kept;
  if (!args.instance_mask_out.empty()) kept.resize(static_cast<size_t>(n));
  std::vector<int32_t> row_targets(static_cast<size_t>(T));
  std::vector<int64_t> targets;
  if (!args.targets_out.empty()) targets.resize(static_cast<size_t>(n * T));
  std::vector<int64_t> doc_lens;
  if (!args.doc_lens_out.empty()) {
    MOE_CHECK(eos >= 0,
              "[data] --doc-lens-out needs --eos-id (the token files have no meta.json that says "
              "it)");
    doc_lens.assign(static_cast<size_t>(n * T), 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    dataset.read_example(i, row.data(), row_targets.data());
    std::copy(row.begin(), row.end(), instances.begin() + i * T);
    if (!targets.empty())
      std::copy(row_targets.begin(), row_targets.end(), targets.begin() + i * T);
    if (!kept.empty()) kept[static_cast<size_t>(i)] = data::keeps_instance(row, args.repetition);
    if (!doc_lens.empty()) {
      const std::vector<int64_t> lengths = document_lengths(
          row.data(), T, static_cast<int32_t>(eos), static_cast<int32_t>(args.bos_id));
      std::copy(lengths.begin(), lengths.end(), doc_lens.begin() + i * T);
    }
  }
  if (!args.out.empty()) data::write_npy(args.out, "<i8", {n, T}, instances.data());
  if (!doc_lens.empty()) data::write_npy(args.doc_lens_out, "<i8", {n, T}, doc_lens.data());
  if (!kept.empty()) data::write_npy(args.instance_mask_out, "|u1", {n}, kept.data());
  if (!targets.empty()) data::write_npy(args.targets_out, "<i8", {n, T}, targets.data());
  nlohmann::json files = nlohmann::json::array();
  for (size_t f = 0; f < dataset.num_files(); ++f)
    files.push_back(
        {{"path", dataset.file_path(f)}, {"dtype", data::token_dtype_name(dataset.file_dtype(f))}});
  nlohmann::json summary = {{"instances", n},
                            {"total_instances", dataset.num_instances()},
                            {"total_tokens", dataset.total_tokens()},
                            {"metadata_eos_id", dataset.metadata_eos_id()},
                            {"files", files}};
  if (!kept.empty()) summary["masked"] = std::count(kept.begin(), kept.end(), uint8_t{0});
  fmt::print("{}\n", summary.dump());
}

void run_data_order(const DataOrderArgs& args) {
  const RunConfig config = load_run_config(args.config, args.overrides);
  const TrainConfig& given = config.train;
  MOE_CHECK(!config.data.train.empty(), "[data] the config's data.train lists no token files");
  const int64_t rows = given.batch_size / given.microbatches;  // per micro-batch, all ranks
  MOE_CHECK(rows % args.dp == 0,
            "[data] --dp={} does not divide a micro-batch of {} rows (train.batch_size / "
            "train.microbatches)",
            args.dp, rows);
  const data::TokenDataset dataset = open_training_set(config);
  // Where `train --resume` would start from the checkpoint (its config may differ from this one
  // as --allow-config-change lets it: another batch size or seq_len moves the position), with
  // the batch in force there (train.batch_sizes).
  ResumePosition position;
  RunConfig in_force = config;
  std::vector<int64_t> history{given.batch_size};
  ReplayOrigin origin;
  int64_t first_step = 0;  // the updates before the first listed
  if (!args.resume.empty()) {
    const SavedRun saved = load_saved_run(args.resume, "[data]");
    first_step = saved.state.step;
    ResumedBatch batch = resumed_batch(saved.config, saved.state, config);
    history = batch.history;
    in_force = batch.in_force;
    position = resume_position(batch.saved_in_force, saved.state, args.resume, in_force,
                               dataset.num_instances());
    origin = resumed_replay_origin(saved.state,
                                   !replay_config_changes(saved.config, config).empty(), position);
  }
  data::DataLoader loader = training_loader(in_force, dataset, position.cursor, args.dp);
  const int64_t per_epoch = loader.order().epoch_length();  // of the first step's batches
  const int64_t per_rank = rows / args.dp;
  // Each rank's rows, step after step, as the trainer reads them (micro-batch after micro-batch);
  // under train.batch_sizes the batch of each step as the schedule makes it.
  std::vector<std::vector<int64_t>> by_rank(static_cast<size_t>(args.dp));
  std::vector<int64_t> batch_sizes;
  std::vector<int32_t> tokens, targets;
  int64_t masked = 0;  // rows data.instance_filter masks
  for (int64_t step = first_step; step < first_step + args.steps; ++step) {
    const std::vector<BatchSizeChange> changes =
        scheduled_batch_changes(in_force, step, origin, history, &dataset);
    for (const BatchSizeChange& change : changes) {
      history.push_back(change.to);
      in_force = change.config;
      origin = change.origin;
    }
    if (!changes.empty()) loader = training_loader(in_force, dataset, origin.data_cursor, args.dp);
    batch_sizes.push_back(in_force.train.batch_size);
    for (int64_t micro = 0; micro < in_force.train.microbatches; ++micro) {
      const std::span<const int64_t> indices = loader.next_batch(rows, tokens, targets);
      const std::span<const uint8_t> masked_rows = loader.masked_rows();
      masked += std::count(masked_rows.begin(), masked_rows.end(), uint8_t{1});
      for (int64_t rank = 0; rank < args.dp; ++rank)
        by_rank[static_cast<size_t>(rank)].insert(by_rank[static_cast<size_t>(rank)].end(),
                                                  indices.begin() + rank * per_rank,
                                                  indices.begin() + (rank + 1) * per_rank);
    }
  }
  if (!args.out.empty()) {
    // [steps, dp, batch / dp]; under a batch size schedule [dp, rows] (each rank's rows of every
    // step, in order: the steps' sizes are the summary's batch_sizes).
    std::vector<int64_t> order;
    if (given.has_batch_size_schedule()) {
      for (const std::vector<int64_t>& rank_rows : by_rank)
        order.insert(order.end(), rank_rows.begin(), rank_rows.end());
      data::write_npy(args.out, "<i8", {args.dp, static_cast<int64_t>(by_rank[0].size())},
                      order.data());
    } else {
      const int64_t rank_batch = given.batch_size / args.dp;
      for (int64_t step = 0; step < args.steps; ++step)
        for (const std::vector<int64_t>& rank_rows : by_rank)
          order.insert(order.end(), rank_rows.begin() + step * rank_batch,
                       rank_rows.begin() + (step + 1) * rank_batch);
      data::write_npy(args.out, "<i8", {args.steps, args.dp, rank_batch}, order.data());
    }
  }
  int64_t read = 0;  // a change of the batch moves the cursor into its batches' order
  for (const int64_t size : batch_sizes) read += size;
  nlohmann::json summary = {{"instances", dataset.num_instances()},
                            {"per_epoch", per_epoch},
                            {"start", position.cursor},
                            {"read", read}};
  if (given.has_batch_size_schedule()) summary["batch_sizes"] = batch_sizes;
  if (config.data.instance_filter) summary["masked"] = masked;
  if (position.moved)
    summary["moved"] = {{"epoch", position.epoch},
                        {"offset", position.offset},
                        {"tokens_read", position.tokens_read},
                        {"read_again", position.read_again}};
  fmt::print("{}\n", summary.dump());
}

namespace {

// Where generation stops, as transformers' `generate` decides for the directory: with a
// generation_config.json, its eos_token_id alone (none named there, or null: at none; transformers
// then does not look at config.json), else config.json's (none named: at none); one id or a list.
// An empty list stops at no EOS too: transformers' EosTokenCriteria tests the sampled token
// against the list (generation/utils.py:1337), so it generates the requested token count.
// (Without a pad_token_id transformers 4.57 instead fails with an IndexError where it takes the
// first EOS id as the padding token (`pad_token_tensor = eos_token_tensor[0]`, utils.py:2101); one
// sequence pads nothing.) nullopt, the tokenizer's EOS, only for a directory with neither file.
std::optional<std::vector<int32_t>> stop_ids_of(const std::string& dir, int64_t vocab_size) {
  const std::string generation_config = dir + "/generation_config.json";
  if (std::filesystem::is_regular_file(generation_config))
    return io::generation_config_eos_token_ids(io::read_text(generation_config, "[generate]"),
                                               generation_config, vocab_size, "[generate]")
        .value_or(std::vector<int32_t>{});
  const std::optional<io::HfModelInfo> info = io::read_hf_model_info(dir, vocab_size);
  if (!info) return std::nullopt;
  return info->eos_token_ids.value_or(std::vector<int32_t>{});
}

}  // namespace

void run_generate(const GenerateArgs& args) {
  const size_t invalid = data::utf8_invalid_offset(args.prompt);
  MOE_CHECK(invalid == std::string::npos, "[generate] --prompt is not UTF-8 at byte {}", invalid);
  LoadedModel m = load_model(args.checkpoint);
  std::string tokenizer_path = args.tokenizer;
  if (tokenizer_path.empty()) tokenizer_path = args.checkpoint + "/tokenizer.json";
  MOE_CHECK(std::filesystem::is_regular_file(tokenizer_path),
            "[generate] no tokenizer: {} does not exist (pass --tokenizer)", tokenizer_path);
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  SamplingConfig sampling;
  sampling.temperature = args.temperature;
  sampling.top_k = args.top_k;
  sampling.top_p = args.top_p;
  sampling.seed = args.seed;
  const std::string text = generate_text(
      m.config.model, m.layout, m.params, tokenizer, args.prompt, args.max_tokens, sampling,
      // As the run's end-of-run sample: its train.precision.
      PrecisionRecipe::from_train(m.config.train.precision, m.config.train.mxfp8),
      stop_ids_of(args.checkpoint, m.config.model.vocab_size));
  fmt::print("{}{}\n", args.prompt, text);
}

void run_eval_downstream(const EvalDownstreamArgs& args) {
  MOE_CHECK(!args.tasks.empty(), "[downstream] give at least one --task");
  MOE_CHECK(args.labels.empty() || args.labels.size() == args.tasks.size(),
            "[downstream] {} --label for {} --task: give none or one per task", args.labels.size(),
            args.tasks.size());
  if (!args.out.empty()) {
    std::vector<NamedPath> inputs{{"--checkpoint", args.checkpoint}};
    for (const std::string& task : args.tasks) inputs.push_back({"--task", task});
    check_outputs_apart(inputs, {{"--out", args.out}});
  }
  LoadedModel m = load_model(args.checkpoint);
  const std::string tokenizer_path =
      args.tokenizer.empty() ? args.checkpoint + "/tokenizer.json" : args.tokenizer;
  MOE_CHECK(std::filesystem::is_regular_file(tokenizer_path),
            "[downstream] no tokenizer: {} does not exist (pass --tokenizer)", tokenizer_path);
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  const int64_t vocab = m.config.model.vocab_size;
  MOE_CHECK(tokenizer.vocab_size() <= vocab,
            "[downstream] tokenizer {} has {} tokens but the checkpoint's model.vocab_size={}",
            tokenizer_path, tokenizer.vocab_size(), vocab);
  const int64_t bos = args.bos_id == -2 ? m.config.data.bos_id : args.bos_id;
  MOE_CHECK(bos >= -1 && bos < vocab, "[downstream] --bos-id={} is outside [0, {}) (-1: none)", bos,
            vocab);
  const int64_t seq_len = args.seq_len > 0 ? args.seq_len : m.config.train.seq_len;
  // Default: the run's micro-batch (it counts every data-parallel rank's sequences); logits of
  // at most the run's head chunk at a time, or 1 GiB of them.
  const int64_t batch_tokens =
      args.batch_tokens > 0
          ? args.batch_tokens
          : m.config.train.batch_size / m.config.train.microbatches * m.config.train.seq_len;
  const int64_t logit_rows = m.config.train.lm_head_chunk_tokens > 0
                                 ? m.config.train.lm_head_chunk_tokens
                                 : std::max<int64_t>(1, (int64_t{1} << 30) / (4 * vocab));

  Transformer model(m.config.model, m.layout);
  // As the run's own validation: in its train.precision.
  model.set_precision(PrecisionRecipe::from_train(m.config.train.precision, m.config.train.mxfp8));
  const LogitsForward forward = [&](const int32_t* tokens, int64_t rows, int64_t seq) {
    model.set_next_logits_on_demand();
    model.forward(m.params, tokens, nullptr, rows, seq);
    return head_logits_at(model, m.params);
  };
  const int32_t pad = 0;  // padding follows every scored position: any id does
  nlohmann::ordered_json report = nlohmann::ordered_json::array();
  for (size_t t = 0; t < args.tasks.size(); ++t) {
    data::IclTaskSpec spec{args.tasks[t], args.labels.empty() ? "" : args.labels[t], args.metric,
                           args.fast_mc};
    const data::IclTask task =
        data::load_icl_task(spec, tokenizer, static_cast<int32_t>(bos), seq_len);
    const std::vector<IclScore> scores = score_icl_task(
        task, forward, vocab, EvalShare{.batch_tokens = batch_tokens}, logit_rows, pad);
    const auto metrics = compute_icl_metrics(task, scores);
    fmt::print("downstream: {} ({} documents, {} samples, metric {})\n", task.label, task.documents,
               task.samples.size(), data::icl_metric_name(task.metric));
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metrics) {
      fmt::print("  {:<48} {:.6f}\n", key, value);
      values[key] = value;
    }
    nlohmann::ordered_json samples = nlohmann::ordered_json::array();
    for (size_t i = 0; i < task.samples.size(); ++i) {
      const data::IclSample& s = task.samples[i];
      nlohmann::ordered_json sample = {{"doc_id", s.doc_id},
                                       {"cont_id", s.cont_id},
                                       {"query_tokens", s.query.size()},
                                       {"logprob", scores[i].logprob}};
      if (task.metric == data::IclMetric::kPmiDc) sample["dc_logprob"] = scores[i].dc_logprob;
      samples.push_back(std::move(sample));
    }
    report.push_back({{"label", task.label},
                      {"path", task.path},
                      {"metric", data::icl_metric_name(task.metric)},
                      {"documents", task.documents},
                      {"context_length", seq_len},
                      {"metrics", std::move(values)},
                      {"samples", std::move(samples)}});
  }
  if (!args.out.empty()) io::write_text_atomic(args.out, report.dump(1) + "\n", "[downstream]");
}

void run_eval_lm(const EvalLmArgs& args) {
  MOE_CHECK(!args.sets.empty(), "[lm_eval] give at least one --set LABEL=PATH");
  std::vector<data::LmEvalSet> sets;
  std::vector<NamedPath> inputs{{"--checkpoint", args.checkpoint}};
  // LABEL=PATH, split.
  auto split = [](const std::string& entry, const char* option) {
    const size_t eq = entry.find('=');
    MOE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < entry.size(),
              "[lm_eval] {} '{}' is not LABEL=PATH", option, entry);
    return std::pair{entry.substr(0, eq), entry.substr(eq + 1)};
  };
  // Each --set a set of its own, in order (a label given again gathers them, as OLMo-core's
  // metadata may label paths A, B, A); the k-th --label-mask of a label is its k-th set's mask.
  for (const std::string& entry : args.sets) {
    auto [label, path] = split(entry, "--set");
    inputs.push_back({"--set", path});
    sets.push_back({std::move(label), {std::move(path)}, {}});
  }
  for (const std::string& entry : args.label_masks) {
    auto [label, path] = split(entry, "--label-mask");
    auto it = std::find_if(sets.begin(), sets.end(), [&label](const data::LmEvalSet& s) {
      return s.label == label && s.label_mask.empty();
    });
    MOE_CHECK(it != sets.end(), "[lm_eval] --label-mask {}: no --set {}=... left without one",
              entry, label);
    inputs.push_back({"--label-mask", path});
    it->label_mask.push_back(std::move(path));
  }
  if (!args.out.empty()) check_outputs_apart(inputs, {{"--out", args.out}});
  MOE_CHECK(args.dtype.empty() || !data::token_dtype_descr(args.dtype).empty(),
            "[lm_eval] --dtype '{}' is not one of uint16, uint32, int32, int64", args.dtype);
  LoadedModel m = load_model(args.checkpoint);
  const int64_t vocab = m.config.model.vocab_size;
  const int64_t eos = args.eos_id == -2 ? m.config.data.eos_id : args.eos_id;
  MOE_CHECK(eos >= -1 && eos < vocab,
            "[lm_eval] --eos-id={} is outside [0, {}) (-1: the meta.json's)", eos, vocab);
  const data::PaddedDocuments docs =
      data::PaddedDocuments::open(sets, m.config.train.seq_len, vocab,
                                  args.dtype.empty() ? m.config.data.dtype : args.dtype, eos);
  const int64_t batches = args.batches >= 0 ? args.batches : m.config.train.lm_eval_batches;
  const std::vector<int64_t> documents =
      lm_eval_documents(docs.num_documents(), lm_eval_batch_documents(m.config), batches);

  Transformer model(m.config.model, m.layout);
  // As the run's own evaluation: in its train.precision, plain causal attention.
  model.set_precision(PrecisionRecipe::from_train(m.config.train.precision, m.config.train.mxfp8));
  const int64_t batch_tokens =
      m.config.train.batch_size / m.config.train.microbatches * m.config.train.seq_len;
  const LmEvalSums sums = score_lm_documents(
      docs, documents,
      [&](const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t seq) {
        return model.forward(m.params, tokens, targets, rows, seq);
      },
      EvalShare{.batch_tokens = batch_tokens}, /*pad_id=*/0);
  nlohmann::ordered_json report = nlohmann::ordered_json::array();
  for (size_t i = 0; i < docs.labels().size(); ++i) {
    nlohmann::ordered_json entry = {{"label", docs.labels()[i]},
                                    {"documents", sums.documents[i]},
                                    {"positions", sums.positions[i]}};
    if (sums.positions[i] == 0) {
      fmt::print("lm: {}  no position counted ({} documents of the {} scored)\n", docs.labels()[i],
                 sums.documents[i], documents.size());
    } else {
      const double ce = sums.loss[i] / sums.positions[i];
      fmt::print("lm: {}  CE loss {:.6f}  PPL {:.4f}  ({} documents, {} positions)\n",
                 docs.labels()[i], ce, std::exp(ce), sums.documents[i], sums.positions[i]);
      entry["CE loss"] = ce;
      entry["PPL"] = std::exp(ce);
    }
    report.push_back(std::move(entry));
  }
  if (!args.out.empty()) io::write_text_atomic(args.out, report.dump(1) + "\n", "[lm_eval]");
}

}  // namespace moecore::cli
