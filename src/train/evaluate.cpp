#include "train/evaluate.h"

#include <cmath>
#include <vector>

#include "core/check.h"

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

int32_t document_masking_eos(const DataConfig& data, const data::TokenDataset& dataset) {
  if (!data.document_masking) return -1;
  const int64_t from_files = dataset.metadata_eos_id();
  MOE_CHECK(data.eos_id < 0 || from_files < 0 || data.eos_id == from_files,
            "[data] data.eos_id={} but the token files' meta.json says eos_id={}", data.eos_id,
            from_files);
  const int64_t eos = data.eos_id >= 0 ? data.eos_id : from_files;
  MOE_CHECK(eos >= 0,
            "[data] data.document_masking needs the EOS id that ends documents: set data.eos_id "
            "(the token files have no meta.json that says it)");
  MOE_CHECK(eos < dataset.vocab_size(), "[data] eos_id={} is outside the vocabulary [0, {})", eos,
            dataset.vocab_size());
  return static_cast<int32_t>(eos);
}

}  // namespace moecore
