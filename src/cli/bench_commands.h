// Measurement subcommands for `make bench` (bench/*.py): the GEMM peak that MFU is measured
// against, and the model FLOPs per token of a config. Both print one JSON object on stdout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::cli {

struct BenchGemmArgs {
  int64_t m = 2048, n = 2048, k = 2048;
  std::string precision = "fp32";  // fp32 | bf16 | mxfp8
  int64_t repeats = 5;             // timed repeats (each at least min_seconds of GEMM calls)
  double min_seconds = 0.2;
  int64_t threads = 0;  // 0: OpenMP's default (every core)
};

// Times kernels::gemm (C = A B, row-major, random inputs) in the given matmul precision (bf16:
// operands rounded to bf16, fp32 accumulation; "emulated": true where the CPU lacks native bf16)
// or, for mxfp8, kernels::cpu::mx_gemm on operands quantised once beforehand (E4M3, rceil; k a
// multiple of 32), and prints the achieved FLOP/s per
// repeat, their median, minimum and maximum (2 m n k FLOPs per call).
void run_bench_gemm(const BenchGemmArgs& args);

// Memory bandwidth as a STREAM triad (a[i] = b[i] + s c[i]) over arrays far larger than the
// caches, with `threads` OpenMP threads: the bytes/s per repeat and their median. Bytes are those
// the memory system moves, 16 per element: STREAM's 12 (b and c read, a written) plus the read of
// a's lines that the write allocates in the cache: the rate of the hardware, which the planner's
// optimizer cost needs (AdamW updates in place, so its written lines were just read and it moves
// exactly the 28 bytes per parameter it counts; at STREAM's 12-byte count the optimizer was
// predicted ~45% slow). The planner's element-wise estimate counts writes once, without the
// write-allocate (plan/op_cost.cpp).
void run_bench_stream(int64_t megabytes, int64_t repeats, int64_t threads);

// MPI point-to-point between ranks 0 and 1 of the job (osu_latency / osu_bw style ping-pong:
// rank 0 sends, rank 1 sends back; one-way time = round trip / 2) for each message size: the
// one-way seconds and bytes/s of each, as rank 0 prints them. Needs at least 2 ranks.
void run_bench_pingpong(int64_t max_megabytes, int64_t repeats);

// The gradient-reduction collectives over every rank of the job, called as the trainer calls them
// (dist/distributed_optimizer.cpp: a non-blocking all-reduce completed by a wait; ZeRO-1's
// reduce-scatter and all-gather) on buffers of 1 MiB, 4, 16, ... up to `max_megabytes`: per size
// and op the median seconds and the bus bandwidth in NCCL-tests' convention (all-reduce
// 2 (n - 1) / n x bytes / s; reduce-scatter and all-gather (n - 1) / n x bytes / s, bytes = the
// whole buffer), which `moecore plan` prices these collectives at when a profile gives them
// (plan/hardware.h). Rank 0 prints one JSON line.
void run_bench_collectives(int64_t max_megabytes, int64_t repeats);

// FLOPs per trained token of a run config's model at train.seq_len (model/flop_count.h) and its
// parameter counts.
void run_bench_flops(const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace moecore::cli
