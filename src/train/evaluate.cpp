#include "train/evaluate.h"

#include <cmath>
#include <vector>

namespace moecore {

EvalResult evaluate(Transformer& model, const ParamBuffers& params,
                    const data::TokenDataset& dataset, int64_t batch_rows, int64_t max_instances) {
  return evaluate([&](const int32_t* tokens, const int32_t* targets, int64_t rows,
                      int64_t seq) { return model.forward(params, tokens, targets, rows, seq); },
                  dataset, batch_rows, max_instances);
}

EvalResult evaluate(const EvalForward& forward, const data::TokenDataset& dataset,
                    int64_t batch_rows, int64_t max_instances) {
  data::ValidationBatches batches(dataset, batch_rows, max_instances);
  std::vector<int32_t> tokens, targets;
  EvalResult result;
  double loss_sum = 0.0;
  for (int64_t rows = batches.next(tokens, targets); rows > 0;
       rows = batches.next(tokens, targets)) {
    const LossParts loss = forward(tokens.data(), targets.data(), rows, dataset.seq_len());
    loss_sum += loss.ce * static_cast<double>(loss.counted_tokens);
    result.tokens += loss.counted_tokens;
    result.instances += rows;
  }
  result.loss = result.tokens > 0 ? loss_sum / static_cast<double>(result.tokens) : 0.0;
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace moecore
