// What the attention kernels (flash_attention.cu, flash_attention_tensor_cores.cu) read alike
// (*.cu only): a head's rows of a [B, T, heads, hd] tensor, and the first key a query attends.
#pragma once

#include <cstdint>

namespace moecore::kernels::cuda {

// Head h of batch row b of a [B, T, heads, hd] tensor: its T rows of hd values, heads * hd apart.
template <typename T>
__device__ inline T* head_rows(T* x, int64_t b, int64_t seq, int64_t heads, int64_t h, int64_t hd) {
  return x + (b * seq * heads + h) * hd;
}

// The first key query t of batch row b attends: its document's start, clamped to [0, t] (the
// values are not checked on the device, and each query always attends itself); 0 without
// documents.
__device__ inline int64_t row_start(const int32_t* doc_start, int64_t b, int64_t seq, int64_t t) {
  if (doc_start == nullptr) return 0;
  const int64_t start = doc_start[b * seq + t];
  return start < 0 ? 0 : (start > t ? t : start);
}

}  // namespace moecore::kernels::cuda
