// The user's day with moecore: tokenizer training, corpus preparation, training, evaluation and
// generation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/instance_filter.h"

namespace moecore::cli {

void run_tokenizer_train(const std::vector<std::string>& inputs, int64_t vocab_size,
                         const std::string& out);
void run_tokenizer_encode(const std::string& tokenizer, const std::string& input,
                          const std::string& out);
struct PrepareArgs {
  std::string tokenizer, out;
  std::vector<std::string> inputs;
  double val_fraction = 0.02;
  bool overwrite = false;
  std::string dtype;        // "" (by vocabulary), "uint16" or "uint32"
  bool npy_header = false;  // NumPy .npy files instead of OLMo-core's headerless ones
};
void run_prepare(const PrepareArgs& args);
// dtype: the element type of headerless files ("" = the checkpoint's data.dtype); label_mask: one
// label mask per token file (data.val_label_mask's form), none when empty.
void run_eval(const std::string& checkpoint, const std::vector<std::string>& data,
              int64_t max_instances, const std::string& dtype,
              const std::vector<std::string>& label_mask = {});

// `moecore data instances`: the training instances of token files as moecore cuts them (from
// blocks of max_target_seq_len tokens where one is given), in file order, written as an int64
// [N, seq_len] .npy; with eos_id >= 0 also each instance's document
// lengths (model/document_mask.h) as doc_lens_out, an int64 [N, seq_len] .npy zero-padded on the
// right. Prints a JSON summary (instances, tokens, each file's dtype, meta.json EOS).
struct DataInstancesArgs {
  std::vector<std::string> data;
  int64_t seq_len = 0;
  int64_t vocab_size = 0;
  std::string dtype;
  int64_t max_instances = 0;       // 0: all
  int64_t eos_id = -1;             // -1: the meta.json's, else no document lengths
  int64_t bos_id = -1;             // OLMo-core's bos_token_id: documents end at EOS + BOS; -1: none
  int64_t max_target_seq_len = 0;  // OLMo-core's max_target_sequence_length; 0: none
  std::string out, doc_lens_out;
  // Label masks, one per token file (data.label_mask), and where the targets go: each instance's
  // targets as training reads them (int64 [N, seq_len], -100 where none).
  std::vector<std::string> label_mask;
  std::string targets_out;
  // OLMo-core's instance filter (data/instance_filter.h) at `repetition`: each instance's
  // instance_mask (1: kept, 0: masked) as a uint8 [N] .npy. Unset: no filter.
  std::string instance_mask_out;
  data::RepetitionFilter repetition;
  bool repetition_given = false;  // a --repetition-* option was given
};
void run_data_instances(const DataInstancesArgs& args);

// `moecore data order CONFIG`: the training instances each data-parallel rank reads in the run's
// first `steps` steps (with --resume, the steps after `train --resume --allow-config-change` from
// that checkpoint: train/training_data.h's resume_position), through the trainer's own loader,
// written as an int64 [steps, dp, train.batch_size / dp] .npy: each rank's instances in the order
// its micro-batches take them. Prints a JSON summary: the training set's instances, how many one
// epoch reads, the cursor the steps start at, how many they read, and under OLMo-core's order
// where a moved position goes on ("moved").
struct DataOrderArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = 1;
  int64_t dp = 1;
  std::string out;
  std::string resume;  // a checkpoint directory: the steps after resuming from it
};
void run_data_order(const DataOrderArgs& args);

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer;
  int64_t max_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};
void run_generate(const GenerateArgs& args);

// `moecore eval-downstream`: a checkpoint's scores on downstream tasks as OLMo-core's in-loop
// evaluator computes them (olmo_eval's OEEvalTask and ICLMetric: train/downstream_eval.h), printed
// one metric a line and, with `out`, written as JSON with each sample's log-likelihood.
struct EvalDownstreamArgs {
  std::string checkpoint, tokenizer, metric, out;
  std::vector<std::string> tasks;   // request directories
  std::vector<std::string> labels;  // empty, or one per task
  bool fast_mc = false;             // every task as olmo_eval's fast multiple choice
  int64_t seq_len = 0;  // the context length queries are cut to (0: the run's train.seq_len)
  int64_t bos_id = -2;  // -2: the run's data.bos_id; -1: none
  // 0: the run's micro-batch (train.batch_size / microbatches x seq), at most 1 GiB of logits
  int64_t batch_tokens = 0;
};
void run_eval_downstream(const EvalDownstreamArgs& args);

// `moecore eval-lm`: a checkpoint's metrics on labelled sets, as OLMo-core's LM evaluator
// (train/lm_evaluator.h) and the run's data.lm_eval.
struct EvalLmArgs {
  std::string checkpoint, dtype, out;
  std::vector<std::string> sets;         // LABEL=PATH, each a set (a label may repeat)
  std::vector<std::string> label_masks;  // LABEL=PATH: the mask of LABEL's next --set
  int64_t batches = -1;                  // -1: the run's train.lm_eval_batches
  int64_t eos_id = -2;                   // -2: the run's data.eos_id (-1: the files' meta.json)
};
void run_eval_lm(const EvalLmArgs& args);

}  // namespace moecore::cli
