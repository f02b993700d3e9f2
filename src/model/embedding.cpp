#include "model/embedding.h"

#include <algorithm>

namespace moecore {

void embedding_forward(const int32_t* tokens, const float* w, float* out, int64_t rows,
                       int64_t dim) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::copy_n(w + tokens[r] * dim, dim, out + r * dim);
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dw, int64_t rows,
                        int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dw + tokens[r] * dim;
    const float* g = dout + r * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += g[j];
  }
}

}  // namespace moecore
