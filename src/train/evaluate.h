// Validation loss: cross-entropy over the first `max_instances` instances of a token dataset, in
// file order, averaged over every counted target token. Used by the trainer and `moecore eval`.
#pragma once

#include <cstdint>
#include <functional>

#include "data/token_dataset.h"
#include "io/metrics_sink.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/run_config.h"

namespace moecore {

struct EvalResult {
  double loss = 0.0;
  double perplexity = 0.0;
  int64_t tokens = 0;
  int64_t instances = 0;
  // The downstream tasks' metrics (train.downstream_tasks), named as logged:
  // "eval/downstream/<label> (<what>)"; empty without tasks.
  io::MetricsSink::Scalars downstream;
  // The labelled sets' metrics (data.lm_eval: train/lm_evaluator.h), named as logged:
  // "eval/lm/<label>/CE loss" and ".../PPL"; empty without sets.
  io::MetricsSink::Scalars lm;
  // The model merger's average was evaluated (ctx.evaluate_merged), not the trained weights.
  bool merged = false;
  // What the evaluation took on this process: its wall time (every evaluator of the step
  // together) and the forward passes it ran, OLMo-core's "throughput/in-loop eval time (s)" and
  // "throughput/in-loop eval batches" (its evaluator callbacks' sums, rank 0's values).
  double seconds = 0.0;
  int64_t batches = 0;
};

EvalResult evaluate(Transformer& model, const ParamBuffers& params,
                    const data::TokenDataset& dataset, int64_t batch_rows, int64_t max_instances);

// The same over any forward pass (e.g. through the pipeline stages, where the last stage alone
// sees the loss): forward(tokens, targets, rows, seq) returns the batch's loss parts.
using EvalForward = std::function<LossParts(const int32_t* tokens, const int32_t* targets,
                                            int64_t rows, int64_t seq)>;
EvalResult evaluate(const EvalForward& forward, const data::TokenDataset& dataset,
                    int64_t batch_rows, int64_t max_instances);

// The EOS id that ends documents under data.document_masking, -1 when masking is off: data.eos_id,
// else the eos_id of the token files' meta.json. Masking without either, or an explicit eos_id
// that contradicts the metadata, is a one-line error.
int32_t document_masking_eos(const DataConfig& data, const data::TokenDataset& dataset);
// data.bos_id under document masking, else -1 (checked against the vocabulary by the config).
inline int32_t document_masking_bos(const DataConfig& data) {
  return data.document_masking ? static_cast<int32_t>(data.bos_id) : -1;
}

}  // namespace moecore
