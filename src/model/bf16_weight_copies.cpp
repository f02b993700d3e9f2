#include "model/bf16_weight_copies.h"

#include "core/check.h"
#include "kernels/ops.h"

namespace moecore {

Bf16WeightCopies::Bf16WeightCopies(std::vector<ParamRange> ranges) {
  size_t total = 0;
  for (const ParamRange& range : ranges) {
    for (const Copy& other : copies_)
      MOE_CHECK(other.range.group != range.group ||
                    range.begin + range.numel <= other.range.begin ||
                    other.range.begin + other.range.numel <= range.begin,
                "[bf16 copies] overlapping ranges at element {}", range.begin);
    copies_.push_back({range, total});
    total += range.numel;
  }
  bits_.resize(total);
}

void Bf16WeightCopies::refresh(const ParamBuffers& params) {
  for (const Copy& copy : copies_) {
    const auto numel = static_cast<int64_t>(copy.range.numel);
    kernels::to_bf16(view(params.data(copy.range.group) + copy.range.begin, {numel}),
                     TensorView(bits_.data() + copy.offset, {numel}, DType::kBf16));
  }
}

const uint16_t* Bf16WeightCopies::find(ParamGroup group, size_t begin, size_t numel) const {
  for (const Copy& copy : copies_)
    if (copy.range.group == group && begin >= copy.range.begin &&
        begin + numel <= copy.range.begin + copy.range.numel)
      return bits_.data() + copy.offset + (begin - copy.range.begin);
  return nullptr;
}

}  // namespace moecore
