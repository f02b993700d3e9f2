// Token embedding lookup: out[N, d] = W[tokens[n], :].
#pragma once

#include <cstdint>

namespace moecore {

void embedding_forward(const int32_t* tokens, const float* w, float* out, int64_t rows,
                       int64_t dim);

// dW[tokens[n], :] += dout[n, :] (serial over rows: repeated tokens must not race).
void embedding_backward(const int32_t* tokens, const float* dout, float* dw, int64_t rows,
                        int64_t dim);

}  // namespace moecore
