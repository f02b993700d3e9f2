// olmo_eval's ICLMetric (the metric of OLMo-core's downstream evaluator): from each sample's
// log-likelihood of its continuation, per document the continuation the model prefers, and over
// the documents accuracy (or length-normalised accuracy, PMI-DC accuracy, F1), the gold
// continuation's CE loss and bits per byte, and the soft scores. Computed as ICLMetric.update and
// .compute do, in their precision: each sample's values in fp32 (torch's fp32 tensors), the
// softmax over a document's continuations in fp32 (as torch's CPU kernel, its vectorised exp
// aside: within an ulp), the means over documents in double (Python's
// sum of floats) or, for the ce_loss and bpb metric types, in fp32 (a sum of 0-d tensors), every
// result rounded to fp32 (torch.tensor); documents in the order their first sample comes, a
// duplicate sample's values ignored.
// The keys are OLMo-core's: "<label> (<what>)", e.g. "arc_easy_rc_5shot (accuracy)", with its
// v1 / v2 variants, in ICLMetric.compute's order.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "data/icl_task.h"

namespace moecore {

// One sample's sums of log-probabilities of its continuation's tokens: after its query, and (for
// pmi_dc) after its domain-conditional query.
struct IclScore {
  double logprob = 0.0;
  double dc_logprob = 0.0;
};

// The metrics of a task whose samples scored `scores` (one per sample). A gold label outside a
// document's continuations, or no document with all its continuations, is a one-line error
// naming the task (and the document).
std::vector<std::pair<std::string, double>> compute_icl_metrics(
    const data::IclTask& task, const std::vector<IclScore>& scores);

}  // namespace moecore
