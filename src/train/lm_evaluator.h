// OLMo-core's LMEvaluator (the "lm" evaluator of its LMEvaluatorCallback): the cross-entropy of
// labelled validation sets ([[data.lm_eval]], data/padded_documents.h), per label the mean over
// its documents' positions and its exponential, logged as eval/lm/<label>/CE loss and
// eval/lm/<label>/PPL.
//
// Which documents: what OLMo-core's NumpyFSLDataLoader (seed 0) visits in one deterministic
// evaluation (reshuffled at epoch 1): NumPy's shuffle of the document numbers with seed 0 + 1,
// whole global batches of batch_instances documents (a tail that fills none is not scored), the
// first max_batches of them (its eval_duration in steps; 0: the whole epoch).
//
// What a label's mean counts (LMEvaluator.update_metrics): the positions its padded label mask
// selects, the mask unshifted (each position of each document, the last one included, whose
// target lies in the padding; with label masks those whose mask is 1), each with its next-token
// loss, or 0 where get_labels ignores the target (padding, or a next token whose mask is 0:
// OLMo-core masks the labels, shifts them left, and -100 is a loss of 0). So without masks the
// CE loss is the documents' summed next-token losses over the sum of their lengths (a one-token
// document adds a position and no loss); with masks, the losses of positions whose token and next
// token are both labels, over the positions whose token is one.
//
// Batching: a pass holds documents of one label (its loss is that label's), longest first, at
// most share.batch_tokens tokens (at least one document), each padded on the right to the pass's
// longest with pad_id (in lockstep, to the round's shape: rows of padding add nothing). Padding
// comes after every scored position: under causal attention and dropless, position-free routing a
// document's losses are those of its instance padded to seq_len, as OLMo-core reads it (a
// capacity-limited dispatch may drop routes otherwise with other neighbours, as it would in
// OLMo-core's own batches; the random and balanced routing modes route by a token's place in the
// batch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/padded_documents.h"
#include "io/metrics_sink.h"
#include "train/eval_passes.h"
#include "train/evaluate.h"
#include "train/run_config.h"

namespace moecore {

// Per label (PaddedDocuments::labels' order): the summed next-token losses of its documents
// scored, the positions counted (above) and the documents.
struct LmEvalSums {
  std::vector<double> loss;
  std::vector<double> positions;
  std::vector<int64_t> documents;
};

// OLMo-core's global evaluation batch in documents for a run configured as `config` (as given:
// OLMo-core builds its evaluator once): the training micro-batch over the data-parallel ranks, as
// its OLMoDDP and Transformer train modules ask (rank_microbatch_size). Its pipeline train module
// refuses the evaluator callbacks; moecore's pipeline stages score the same documents.
int64_t lm_eval_batch_documents(const RunConfig& config);

// The documents one evaluation scores, in OLMo-core's visiting order (above). Fewer documents than
// one batch is a one-line error (OLMo-core's loader would score none).
std::vector<int64_t> lm_eval_documents(int64_t num_documents, int64_t batch_instances,
                                       int64_t max_batches);

// Scores `documents` with `forward` (which returns a pass's loss parts where the LM head is, zeros
// elsewhere). With share.shards > 1 this process runs only its share of the passes
// (train/eval_passes.h: spread, or in lockstep for expert parallelism) and leaves the others'
// losses 0: summed over the shards, the losses are whole. `positions` and `documents` are whole
// on every process.
LmEvalSums score_lm_documents(const data::PaddedDocuments& docs,
                              const std::vector<int64_t>& documents, const EvalForward& forward,
                              const EvalShare& share, int32_t pad_id);

// "<prefix><label>/CE loss" and "<prefix><label>/PPL" per label that had a position counted
// (OLMo-core logs NaN for one that had none; it is left out here).
io::MetricsSink::Scalars lm_eval_metrics(const data::PaddedDocuments& docs, const LmEvalSums& sums,
                                         const std::string& prefix);

}  // namespace moecore
