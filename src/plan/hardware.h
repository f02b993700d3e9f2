// What a rank runs on, for the planner: memory per rank and the process's own baseline (code,
// libraries, MPI, thread stacks, allocator slack) that no tensor accounts for, and the rates the
// step-time model (plan/step_time.h) prices operations with.
// Built in: "cpu" (this machine: its physical memory; the baseline measured on a moecore training
// process; no rates: they are measured, see below), "h100", "h200", "b200" (NVIDIA data sheet
// figures, each with its source in hardware.cpp, and an assumed 1 GiB of CUDA context and
// workspace). A JSON file describes any other:
//   {"name", "memory_gib", "runtime_overhead_mib", "device",
//    "gemm_tflops_fp32", "gemm_tflops_bf16", "gemm_tflops_mxfp8", "peak_tflops_fp32",
//    "peak_tflops_bf16", "mx_quantize_gvalues", "mx_weight_refresh_gvalues",
//    "memory_bandwidth_gbs", "link_bandwidth_gbs", "link_latency_us",
//    "node_ranks", "cores_per_node", "network_bandwidth_gbs", "network_latency_us",
//    "async_communication", "gemm_overlaps_memory" (default: "device"),
//    "collective_bus_gbs": {"allreduce" | "reduce_scatter" | "allgather":
//    [[buffer bytes, GB/s], ...]}, "collective_ranks"}
// `make bench-plan` writes one for this CPU (bench/results/cpu_profile.json) from `moecore bench
// gemm`, `moecore bench stream`, `moecore bench pingpong` and `moecore bench collectives`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moecore::plan {

// Bytes/s of a collective by buffer size: (buffer bytes, bytes/s) in increasing size, read
// log-linearly between the points and as the nearest point beyond them; 0 when empty.
struct BusBandwidth {
  std::vector<std::pair<double, double>> points;
  double at(double bytes) const;
};

// Rates of one rank (GB and TFLOP in powers of ten). Zero where unknown: no step time then.
struct Rates {
  double gemm_flops_fp32 = 0.0;  // FLOP/s a GEMM achieves (what the roofline prices GEMMs at)
  double gemm_flops_bf16 = 0.0;
  // An MXFP8 GEMM (train.precision = "mxfp8"'s MX GEMMs) on operands already quantised; 0: at the
  // bf16 rate (Hopper's dequantised path). On a CPU it is the exact MX GEMM (no x86 core
  // multiplies FP8: it decodes to fp32 and sums in a fixed order), measured by `moecore bench gemm
  // --precision mxfp8`, well below the bf16 rate.
  double gemm_flops_mxfp8 = 0.0;
  // The MX quantisers (`moecore bench gemm --precision mxfp8`): activation values quantised per
  // second before an MX GEMM, and weights per second refreshed into both cached orientations
  // after each optimizer step; 0: a memory-bound pass at memory_bandwidth (a GPU's fused kernels).
  double mx_quantize_values = 0.0;
  double mx_weight_refresh_values = 0.0;
  double peak_flops_fp32 = 0.0;   // the MFU denominator: measured GEMM peak on a CPU (DESIGN.md,
  double peak_flops_bf16 = 0.0;   // Measuring), the data sheet's dense peak on a GPU
  double memory_bandwidth = 0.0;  // bytes/s a streaming kernel reads plus writes
  double link_bandwidth = 0.0;    // bytes/s one rank sends to a rank of its node
  double link_latency = 0.0;      // seconds per message within a node
  int64_t node_ranks = 0;         // ranks per node; 0: every rank on one node
  // Cores' worth of these rates that a node's ranks share; 0: a core (or GPU) per rank. When
  // more ranks run on a node than that (mpirun oversubscribing a small or shared CPU), each rank
  // gets cores / ranks of the rates. On a CPU it is measured, not counted: the summed GEMM rate of
  // two ranks running at once over one rank's alone (bench/plan_validation.py), which also sees
  // the other jobs of a shared machine.
  double cores_per_node = 0.0;
  double network_bandwidth = 0.0;  // bytes/s one rank sends to another node
  double network_latency = 0.0;
  // Collectives progress while compute runs (NCCL on its own stream, copy engines moving the
  // bytes); false for Open MPI on a CPU: a nonblocking collective advances only inside MPI calls,
  // and the rank's own core copies the bytes through shared memory, so a rank's link bandwidth is
  // shared out with its cores like its compute rates (op_cost.h, rank_share).
  bool async_communication = false;
  // A GEMM's operand traffic hides under its arithmetic (a GPU's tensor cores fed by
  // asynchronous copies), so the roofline takes the larger of the two; false on a CPU, whose BLAS
  // packs operand panels in passes of their own before the FMAs: the two add up. Measured with
  // bench/plan_validation.py: the sum predicts the CPU layouts' step time within -2%..+16% where
  // the larger of the two underestimated by 11-33% (most where the experts' GEMMs have few rows).
  bool gemm_overlaps_memory = false;
  // Measured bus bandwidth (NCCL-tests' convention, `moecore bench collectives`) of the gradient
  // collectives within a node, their reduction included, by buffer size, with `collective_ranks`
  // ranks sharing the node; empty: priced from the link and memory bandwidths instead. Open MPI's
  // shared-memory collectives run far below its point-to-point rate and slow down with size
  // (measured here: all-reduce 1.7 GB/s at 1 MiB, 0.6 at 64 MiB, against 3-6 GB/s ping-pong),
  // which the link model cannot see.
  BusBandwidth allreduce_bus, reduce_scatter_bus, allgather_bus;
  int64_t collective_ranks = 2;
  bool known() const {
    return gemm_flops_fp32 > 0.0 && gemm_flops_bf16 > 0.0 && memory_bandwidth > 0.0 &&
           link_bandwidth > 0.0;
  }
};

struct Hardware {
  std::string name;
  double memory_bytes = 0.0;
  double runtime_bytes = 0.0;
  std::string source;  // where the figures come from
  // An accelerator: the trainer's host-side buffers (the batch's token ids) are host
  // memory, not counted against memory_bytes.
  bool device = false;
  Rates rates;
};

// A built-in name (case-insensitive) or the path of a JSON profile; one-line error otherwise.
Hardware load_hardware(const std::string& name_or_file);

}  // namespace moecore::plan
