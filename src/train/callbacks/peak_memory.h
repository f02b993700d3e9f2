// The peak resident memory of the training (core/host_memory.h's peak_resident_kib: the
// process's own high-water mark) once the run is saved and evaluated, before the sample: the
// largest rank's, and with pipeline parallelism the largest of each stage, for the run's last
// line (bench/ reads it there). Collective.
#pragma once

#include "train/callback.h"

namespace moecore {

class PeakMemoryCallback final : public Callback {
 public:
  void on_end(TrainContext& ctx) override;
};

}  // namespace moecore
