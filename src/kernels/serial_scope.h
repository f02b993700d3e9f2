// Runs the kernels of the enclosing scope on one thread when asked (the calling thread's nthreads
// ICV, which the CPU kernels and oneDNN read), restoring the previous value on exit, exceptions
// included. For callers whose work is too small to pay for fork/join (a small model's decode step).
#pragma once

#include <omp.h>

namespace moecore::kernels {

class SerialScope {
 public:
  explicit SerialScope(bool serial) : previous_(omp_get_max_threads()) {
    if (serial) omp_set_num_threads(1);
  }
  ~SerialScope() { omp_set_num_threads(previous_); }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int previous_;
};

}  // namespace moecore::kernels
