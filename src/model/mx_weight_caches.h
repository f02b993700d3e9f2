// MXFP8 caches of the weights that MX GEMMs read, quantised once per optimizer step (OLMo-core 3's
// prequantized weight caches) instead of in every GEMM call. A weight [out, in] (or a rank's block
// of experts [E, out, in]) is read by two MX GEMMs contracting along different dimensions, so it
// has two caches: along `in` for the forward (y = x . w^T) and along `out` for the input gradient
// (dx = dy . w), the latter quantised from the fp32 values in blocks of 32 rows, not a byte
// transpose of the first (kernels/op_declarations.inc says which operand goes which way).
// Refreshed where the bf16 copies are (Transformer::weights_changed).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/mx_types.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/params.h"
#include "model/precision_recipe.h"

namespace moecore {

// One weight's two MX caches, and how its linear layer (model/linear.h) runs the weight gradient.
struct MxWeight {
  MxOperandView along_in;    // codes [.., out, in], scales [.., out, in / 32]: the forward's
  MxOperandView along_out;   // codes [.., in, out], scales [.., in, out / 32]: the input gradient's
  mx::ScaleMode scale_mode;  // of these caches, and of the activations multiplied with them
  // The weight gradient an MX GEMM too (an MXFP8 linear of mxfp8_dense; an expert under
  // mxfp8_expert_wgrad), else a bf16 GEMM on the layer's inputs (the shared expert in OLMo-core's
  // recipe, which saves them in bf16).
  bool mx_weight_grad = true;
};

// A weight the recipe multiplies in MXFP8: elements [begin, begin + batch * out * in) of one
// parameter buffer, as `batch` matrices [out, in] (batch: a rank's experts, else 1).
struct MxWeightRange {
  ParamGroup group;
  size_t begin;
  int64_t batch, out, in;
  bool mx_weight_grad = true;  // MxWeight::mx_weight_grad
};

// The MX weights of layers `layers` of `layout` under `recipe`: the experts' gate/up and down
// blocks and the shared expert (recipe.mx.experts), attention projections (recipe.mx.attention),
// dense layers' MLPs (recipe.mx.dense_mlp); gate and up as one [2H, d] weight. Every dimension of
// each must be a multiple of 32: anything else is a one-line error naming the checkpoint's tensor,
// its shape and the config key at fault, as MXFP8 has no other way to run it.
std::vector<MxWeightRange> mx_weight_ranges(const ModelConfig& config, const ParamLayout& layout,
                                            LayerRange layers, const PrecisionRecipe& recipe);

class MxWeightCaches {
 public:
  MxWeightCaches() = default;
  MxWeightCaches(std::vector<MxWeightRange> ranges, mx::ScaleMode scale_mode);
  MxWeightCaches(const MxWeightCaches&) = delete;
  MxWeightCaches& operator=(const MxWeightCaches&) = delete;
  MxWeightCaches(MxWeightCaches&&) = default;
  MxWeightCaches& operator=(MxWeightCaches&&) = default;

  // Quantises every cache from `params` (kernels::mx_quantize and mx_quantize_transposed, E4M3).
  void refresh(const ParamBuffers& params);

  // The caches of the weight that starts at element `begin` of `group`, or nullptr when the
  // recipe does not multiply it in MXFP8.
  const MxWeight* find(ParamGroup group, size_t begin) const;

  // Bytes held (codes and scales, both orientations): moecore plan counts the same.
  size_t bytes() const { return bytes_.size(); }

 private:
  struct Cache {
    MxWeightRange range;
    size_t offset;    // into bytes_
    MxWeight weight;  // views of bytes_ from offset
  };
  mx::ScaleMode scale_mode_ = mx::ScaleMode::kRceil;
  std::vector<Cache> caches_;
  DeviceArray<uint8_t> bytes_;
};

// The bytes of one range's two caches: 2 * numel codes + 2 * numel / 32 scales.
size_t mx_cache_bytes(const MxWeightRange& range);

}  // namespace moecore
