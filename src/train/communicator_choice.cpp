#include "train/communicator_choice.h"

#include <fmt/format.h>

#include <string_view>

#include "core/check.h"

namespace moecore {

namespace {

// Why pipeline stages keep a job on MPI.
constexpr const char* kPipelineOnMpi =
    "pipeline stages pass activations over MPI (NCCL's point-to-point has no tags and holds the "
    "GPU's stream), and a rank waiting for the GPU in an NCCL collective does not progress MPI's "
    "transfers in flight, which can stall the stages in a cycle";

// The choice for parallel.communicator alone.
CommunicatorChoice resolve(const RunConfig& config, int64_t world_size,
                           const UnusableReason& unusable) {
  const Device device = config.train.device;
  const dist::DeviceCommunicatorFactory* factory = dist::device_communicator(device);
  const bool nccl = factory != nullptr && std::string_view(factory->name) == "nccl";
  CommunicatorChoice choice;
  switch (config.parallel.communicator) {
    case CommunicatorKind::kMpi:
      choice.description = "mpi";
      return choice;
    case CommunicatorKind::kNccl:
      check_communicator_layout(config);
      MOE_CHECK(nccl,
                "[parallel] parallel.communicator=\"nccl\": this moecore program has no NCCL "
                "communicator for {} memory (build it with NCCL next to the CUDA toolkit, `cmake "
                "--preset cuda`), or use \"auto\" or \"mpi\"",
                device_name(device));
      if (const std::string why = unusable(*factory); !why.empty())
        fail("[parallel] parallel.communicator=\"nccl\": {} (use \"auto\" or \"mpi\")", why);
      choice.device = factory;
      break;
    case CommunicatorKind::kAuto:
      if (device == Device::kCpu) {
        choice.description = "mpi";
        return choice;
      }
      if (!nccl) {
        choice.description = fmt::format(
            "mpi (auto: this program has no NCCL communicator for {} memory)", device_name(device));
        return choice;
      }
      if (world_size == 1) {
        choice.description = "mpi (auto: one rank)";
        return choice;
      }
      if (config.parallel.pp > 1) {
        choice.description = fmt::format("mpi (auto: {})", kPipelineOnMpi);
        return choice;
      }
      if (const std::string why = unusable(*factory); !why.empty()) {
        choice.description = fmt::format("mpi (auto: {})", why);
        return choice;
      }
      choice.device = factory;
      break;
  }
  choice.description = "nccl";
  return choice;
}

}  // namespace

void check_communicator_layout(const RunConfig& config) {
  if (config.parallel.communicator != CommunicatorKind::kNccl) return;
  MOE_CHECK(config.train.device != Device::kCpu,
            "[parallel] parallel.communicator=\"nccl\" needs train.device=\"cuda\" (NCCL moves a "
            "GPU's memory; this run's model is on the cpu): use \"auto\" or \"mpi\"");
  MOE_CHECK(config.parallel.pp == 1,
            "[parallel] parallel.communicator=\"nccl\" with parallel.pp={}: {} (use \"auto\" or "
            "\"mpi\")",
            config.parallel.pp, kPipelineOnMpi);
}

CommunicatorChoice choose_communicator(const RunConfig& config, int64_t world_size,
                                       const UnusableReason& unusable) {
  CommunicatorChoice choice = resolve(config, world_size, unusable);
  const ParallelConfig& pc = config.parallel;
  // Only the device's communicator stores into other GPUs' memory (DeviceBlockExchange).
  MOE_CHECK(pc.rowwise_transport != RowwiseTransport::kSymmetric || pc.ep == 1 ||
                choice.device != nullptr,
            "[parallel] parallel.rowwise_transport=\"symmetric\" needs the NCCL communicator, "
            "and this job's is {}: use \"padded\"",
            choice.description);
  return choice;
}

}  // namespace moecore
