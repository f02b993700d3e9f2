// What a rank runs on, for the planner: memory per rank and the process's own baseline (code,
// libraries, MPI, thread stacks, allocator slack) that no tensor accounts for.
// Built in: "cpu" (this machine: its physical memory; the baseline measured on a moecore training
// process), "h100" (80 GB), "h200" (141 GB), "b200" (180 GB), GPU memory from NVIDIA's data sheets
// and an assumed 1 GiB of CUDA context and workspace. A JSON file {"name", "memory_gib",
// "runtime_overhead_mib", "device"} describes any other.
#pragma once

#include <string>

namespace moecore::plan {

struct Hardware {
  std::string name;
  double memory_bytes = 0.0;
  double runtime_bytes = 0.0;
  std::string source;  // where the figures come from
  // An accelerator: the trainer's host-side buffers (the whole-model copy, the batch's token ids)
  // are host memory, not counted against memory_bytes.
  bool device = false;
};

// A built-in name (case-insensitive) or the path of a JSON profile; one-line error otherwise.
Hardware load_hardware(const std::string& name_or_file);

}  // namespace moecore::plan
