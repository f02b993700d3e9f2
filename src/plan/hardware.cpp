#include "plan/hardware.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/escape.h"
#include "core/host_memory.h"
#include "plan/units.h"

namespace moecore::plan {

namespace {

// Peak RSS of a moecore training process whose tensors are negligible (a d 16, 1-layer model):
// 19 MiB alone, 25-26 MiB per rank under mpirun (binary, oneDNN, OpenMP, Open MPI, allocator
// arenas), measured with `moecore train` on the development machine; the MPI figure, less the
// model's own ~2 MiB.
constexpr double kCpuRuntimeMiB = 24.0;
constexpr double kGpuRuntimeGiB = 1.0;  // assumed: CUDA context, cuBLAS/NCCL workspaces

}  // namespace

double BusBandwidth::at(double bytes) const {
  if (points.empty()) return 0.0;
  if (bytes <= points.front().first) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  const auto above = std::find_if(points.begin(), points.end(),
                                  [bytes](const auto& p) { return p.first >= bytes; });
  const auto below = above - 1;
  const double t = std::log(bytes / below->first) / std::log(above->first / below->first);
  return below->second + t * (above->second - below->second);
}

Hardware load_hardware(const std::string& spec) {
  std::string lower = spec;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lower == "cpu") {
    return {"cpu",
            host_physical_memory_bytes(),
            kCpuRuntimeMiB * kMiB,
            "this machine's physical memory; baseline measured on moecore train",
            false,
            {}};
  }
  // Data sheet figures per GPU: NVIDIA H100 Tensor Core GPU data sheet (SXM5: 80 GB, 3.35 TB/s,
  // BF16 1,979 TFLOPS with sparsity = 989 dense, FP32 67 TFLOPS, NVLink 900 GB/s); NVIDIA H200
  // data sheet (SXM: 141 GB, 4.8 TB/s, same compute and NVLink as H100); NVIDIA Blackwell
  // data sheet, HGX B200 column (180 GB, 7.7 TB/s, BF16 4.5 PFLOPS with sparsity = 2.25 dense,
  // FP32 75 TFLOPS, NVLink 5 1.8 TB/s). NVLink figures are both directions together: a rank
  // sends at half. Between nodes: DGX H100/H200/B200 data sheets, one 400 Gb/s ConnectX-7 per GPU
  // (50 GB/s), 8 GPUs a node. Latencies are assumed (a few microseconds per NCCL message).
  // What a GEMM achieves: 80% of the data sheet's dense peak, the ratio measured on an H200
  // (DESIGN.md: ~790 TFLOP/s bf16 for 8192^3 through PyTorch against 989), used for all three.
  // MXFP8 GEMMs: Blackwell's block-scaled tensor cores at its FP8 rate (B200: 9 PFLOPS with
  // sparsity = 4.5 dense); Hopper has no MX tensor cores, so its MXFP8 GEMMs run as dequantised
  // bf16 GEMMs (issue 16) at the bf16 rate (0 here: the bf16 rate is the fallback).
  constexpr double kGemmFraction = 790.0 / 989.0;
  const auto gpu = [&](const char* name, double gb, double bf16_tflops, double fp32_tflops,
                       double mxfp8_tflops, double memory_tbs, double nvlink_gbs) {
    Hardware h{name,
               gb * 1e9,
               kGpuRuntimeGiB * kGiB,
               "NVIDIA data sheets (see plan/hardware.cpp); 1 GiB CUDA context and workspaces "
               "assumed",
               true,
               {}};
    Rates& r = h.rates;
    r.peak_flops_bf16 = bf16_tflops * 1e12;
    r.peak_flops_fp32 = fp32_tflops * 1e12;
    r.gemm_flops_bf16 = kGemmFraction * r.peak_flops_bf16;
    r.gemm_flops_fp32 = kGemmFraction * r.peak_flops_fp32;
    r.gemm_flops_mxfp8 = kGemmFraction * mxfp8_tflops * 1e12;
    r.memory_bandwidth = memory_tbs * 1e12;
    r.link_bandwidth = 0.5 * nvlink_gbs * 1e9;
    r.link_latency = 3e-6;
    r.node_ranks = 8;
    r.network_bandwidth = 50e9;
    r.network_latency = 5e-6;
    r.async_communication = true;  // NCCL runs on its own stream
    r.gemm_overlaps_memory = true;
    return h;
  };
  if (lower == "h100") return gpu("h100", 80.0, 989.0, 67.0, 0.0, 3.35, 900.0);
  if (lower == "h200") return gpu("h200", 141.0, 989.0, 67.0, 0.0, 4.8, 900.0);
  if (lower == "b200") return gpu("b200", 180.0, 2250.0, 75.0, 4500.0, 7.7, 1800.0);
  MOE_CHECK(std::filesystem::is_regular_file(spec),
            "[plan] --hardware {}: not a built-in profile (cpu, h100, h200, b200) nor a file",
            spec);
  std::ifstream in(spec);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "[plan] --hardware {}: not valid JSON ({})", spec, e.what());
  }
  // A misspelt key would silently plan with a default in its place ("measured": where the figures
  // came from, written by bench/plan_validation.py, not read).
  static const std::set<std::string> kKeys = {"name",
                                              "memory_gib",
                                              "runtime_overhead_mib",
                                              "device",
                                              "gemm_tflops_fp32",
                                              "gemm_tflops_bf16",
                                              "gemm_tflops_mxfp8",
                                              "mx_quantize_gvalues",
                                              "mx_weight_refresh_gvalues",
                                              "peak_tflops_fp32",
                                              "peak_tflops_bf16",
                                              "memory_bandwidth_gbs",
                                              "link_bandwidth_gbs",
                                              "link_latency_us",
                                              "network_bandwidth_gbs",
                                              "network_latency_us",
                                              "node_ranks",
                                              "cores_per_node",
                                              "collective_bus_gbs",
                                              "collective_ranks",
                                              "async_communication",
                                              "gemm_overlaps_memory",
                                              "measured"};
  if (j.is_object())
    for (const auto& [key, value] : j.items())
      MOE_CHECK(kKeys.count(key) != 0, "[plan] --hardware {}: unknown key \"{}\" (the keys: {})",
                spec, escape_for_message(key), fmt::join(kKeys, ", "));
  MOE_CHECK(j.is_object() && j.contains("memory_gib") && j["memory_gib"].is_number() &&
                j["memory_gib"].get<double>() > 0.0,
            "[plan] --hardware {}: needs a positive number \"memory_gib\"", spec);
  Hardware h;
  h.name = j.value("name", std::filesystem::path(spec).stem().string());
  h.memory_bytes = j["memory_gib"].get<double>() * kGiB;
  const double overhead = j.value("runtime_overhead_mib", 0.0);
  MOE_CHECK(overhead >= 0.0, "[plan] --hardware {}: runtime_overhead_mib={} must be >= 0", spec,
            overhead);
  h.runtime_bytes = overhead * kMiB;
  h.device = j.value("device", false);
  h.source = spec;
  // Rates: all or none (a profile of memory alone plans memory alone).
  const auto number = [&](const char* key, double scale) {
    if (!j.contains(key)) return 0.0;
    MOE_CHECK(j[key].is_number() && j[key].get<double>() > 0.0,
              "[plan] --hardware {}: \"{}\" must be a positive number", spec, key);
    return j[key].get<double>() * scale;
  };
  Rates& r = h.rates;
  r.gemm_flops_fp32 = number("gemm_tflops_fp32", 1e12);
  r.gemm_flops_bf16 = number("gemm_tflops_bf16", 1e12);
  r.gemm_flops_mxfp8 = number("gemm_tflops_mxfp8", 1e12);
  r.mx_quantize_values = number("mx_quantize_gvalues", 1e9);
  r.mx_weight_refresh_values = number("mx_weight_refresh_gvalues", 1e9);
  r.peak_flops_fp32 = number("peak_tflops_fp32", 1e12);
  r.peak_flops_bf16 = number("peak_tflops_bf16", 1e12);
  if (r.peak_flops_fp32 == 0.0) r.peak_flops_fp32 = r.gemm_flops_fp32;
  if (r.peak_flops_bf16 == 0.0) r.peak_flops_bf16 = r.gemm_flops_bf16;
  r.memory_bandwidth = number("memory_bandwidth_gbs", 1e9);
  r.link_bandwidth = number("link_bandwidth_gbs", 1e9);
  r.link_latency = number("link_latency_us", 1e-6);
  r.network_bandwidth = number("network_bandwidth_gbs", 1e9);
  r.network_latency = number("network_latency_us", 1e-6);
  if (j.contains("node_ranks")) {
    MOE_CHECK(j["node_ranks"].is_number_integer() && j["node_ranks"].get<int64_t>() >= 1,
              "[plan] --hardware {}: \"node_ranks\" must be a positive integer", spec);
    r.node_ranks = j["node_ranks"].get<int64_t>();
  }
  r.cores_per_node = number("cores_per_node", 1.0);
  if (j.contains("collective_bus_gbs")) {
    const nlohmann::json& bus = j["collective_bus_gbs"];
    MOE_CHECK(bus.is_object(), "[plan] --hardware {}: \"collective_bus_gbs\" must be an object",
              spec);
    for (const auto& [key, curve] : bus.items()) {
      BusBandwidth* target = key == "allreduce"        ? &r.allreduce_bus
                             : key == "reduce_scatter" ? &r.reduce_scatter_bus
                             : key == "allgather"      ? &r.allgather_bus
                                                       : nullptr;
      MOE_CHECK(target != nullptr,
                "[plan] --hardware {}: collective_bus_gbs.{} is not allreduce, reduce_scatter or "
                "allgather",
                spec, key);
      MOE_CHECK(curve.is_array() && !curve.empty(),
                "[plan] --hardware {}: collective_bus_gbs.{} must be a list of [bytes, GB/s]", spec,
                key);
      for (const nlohmann::json& point : curve) {
        MOE_CHECK(point.is_array() && point.size() == 2 && point[0].is_number() &&
                      point[1].is_number() && point[0].get<double>() > 0.0 &&
                      point[1].get<double>() > 0.0,
                  "[plan] --hardware {}: collective_bus_gbs.{} needs [bytes, GB/s] pairs of "
                  "positive numbers",
                  spec, key);
        const double bytes = point[0].get<double>();
        MOE_CHECK(target->points.empty() || bytes > target->points.back().first,
                  "[plan] --hardware {}: collective_bus_gbs.{} sizes must increase", spec, key);
        target->points.emplace_back(bytes, point[1].get<double>() * 1e9);
      }
    }
  }
  if (j.contains("collective_ranks")) {
    MOE_CHECK(
        j["collective_ranks"].is_number_integer() && j["collective_ranks"].get<int64_t>() >= 2,
        "[plan] --hardware {}: \"collective_ranks\" must be an integer >= 2", spec);
    r.collective_ranks = j["collective_ranks"].get<int64_t>();
  }
  r.async_communication = j.value("async_communication", false);
  r.gemm_overlaps_memory = j.value("gemm_overlaps_memory", h.device);
  const bool any = r.gemm_flops_fp32 > 0.0 || r.gemm_flops_bf16 > 0.0 || r.memory_bandwidth > 0.0 ||
                   r.link_bandwidth > 0.0;
  MOE_CHECK(!any || r.known(),
            "[plan] --hardware {}: a step-time profile needs gemm_tflops_fp32, gemm_tflops_bf16, "
            "memory_bandwidth_gbs and link_bandwidth_gbs together",
            spec);
  MOE_CHECK(r.node_ranks == 0 || r.network_bandwidth > 0.0,
            "[plan] --hardware {}: node_ranks needs network_bandwidth_gbs", spec);
  return h;
}

}  // namespace moecore::plan
