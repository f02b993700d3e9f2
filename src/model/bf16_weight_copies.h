// bf16 copies of the weights that bf16 GEMMs read. Where the precision recipe multiplies a module
// in bf16 (attention projections, routed experts, dense MLPs and shared experts, LM head; never the
// router), its GEMM weights are rounded to bf16 once, by refresh(), instead of by every GEMM call:
// a weight is read by the forward, the input-gradient GEMM and, with activation recompute, the
// forward again, in every micro-batch. The trainer refreshes once per optimizer step
// (Transformer::weights_changed). A copy rounds exactly as the per-call conversion did, so the
// GEMMs' results do not change. The copies keep the weights' plain layout: pre-packing them into
// oneDNN's blocked layout was measured and gains nothing on these GEMMs
// (bench/results/bf16_prepack.md).
//
// The copies cover element ranges of the two parameter buffers rather than whole tensors because
// some GEMMs read several tensors as one operand (a dense layer's gate and up projections, a rank's
// block of experts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "model/config.h"
#include "model/params.h"
#include "model/precision_recipe.h"

namespace moecore {

// Elements [begin, begin + numel) of one parameter buffer.
struct ParamRange {
  ParamGroup group;
  size_t begin;
  size_t numel;
};

// What a recipe copies in the layers `layers` of `layout` (and the LM head when the range ends at
// the last layer): the GEMM weights of every module the recipe multiplies in bf16, a dense
// layer's gate and up projections (and a rank's block of experts) as one range. moecore plan
// counts the copies' memory from the same list.
std::vector<ParamRange> bf16_copy_ranges(const ModelConfig& config, const ParamLayout& layout,
                                         LayerRange layers, const PrecisionRecipe& recipe);

class Bf16WeightCopies {
 public:
  Bf16WeightCopies() = default;
  // One copy per range (ranges must not overlap); none: nothing is copied.
  explicit Bf16WeightCopies(std::vector<ParamRange> ranges);

  // Rounds every copy from `params` (kernels::to_bf16).
  void refresh(const ParamBuffers& params);

  // The copy of elements [begin, begin + numel) of `group`, or nullptr when no range covers them.
  const uint16_t* find(ParamGroup group, size_t begin, size_t numel) const;

  size_t numel() const { return bits_.size(); }

 private:
  struct Copy {
    ParamRange range;
    size_t offset;  // into bits_
  };
  std::vector<Copy> copies_;
  DeviceArray<uint16_t> bits_;
};

}  // namespace moecore
