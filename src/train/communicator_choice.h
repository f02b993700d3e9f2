// parallel.communicator resolved for a training job (train/run_config.h): the transport its groups
// (world, dp, ep, ep_dp) use. MPI (dist/mpi/mpi_runtime.h) is always there; a communicator over a
// device's memory (NCCL for CUDA) only where the program registered one for train.device
// (dist/device_communicators.h: the moecore command does when it selects the GPU). Pipeline
// stages keep the job on MPI: their activations cannot travel over NCCL (its point-to-point has
// no tags and a posted receive holds the device's stream until its message arrives, which the
// pipeline's receives posted ahead would deadlock on), and beside MPI's transfers in flight a
// rank that waits for the GPU in an NCCL collective does not progress them, which can close a
// cycle of waiting stages. The pp group of an NCCL job (pp = 1: a group of one) is MPI's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dist/device_communicators.h"
#include "train/run_config.h"

namespace moecore {

struct CommunicatorChoice {
  // The device's communicator, or nullptr: the groups are MPI's (split from its world).
  const dist::DeviceCommunicatorFactory* device = nullptr;
  // For the start-up line: "mpi", "nccl", or what auto weighed where it
  // left a device's run on MPI ("mpi (auto: one rank)").
  std::string description;
};

// Why the registered factory cannot serve the job's ranks, or "" (the trainer asks the factory's
// `unusable` over MPI's world: collective, and called by every rank alike or by none).
using UnusableReason = std::function<std::string(const dist::DeviceCommunicatorFactory&)>;

// auto: the device's communicator where train.device is a device with one registered, the job has
// more than one rank (with one nothing moves, and MPI's group of one costs nothing to make) and
// the factory can serve them (`unusable` says "": e.g. no two ranks on one GPU) and there is one
// pipeline stage; else MPI, the description saying why. "mpi": MPI. "nccl": the device's
// communicator named nccl, or one line naming parallel.communicator and why it cannot be used
// (train.device=cpu; a program without NCCL; parallel.pp > 1; what `unusable` says).
// parallel.rowwise_transport="symmetric" with ep > 1 on MPI is a one-line error naming why.
CommunicatorChoice choose_communicator(const RunConfig& config, int64_t world_size,
                                       const UnusableReason& unusable);

// What the config alone rules out for parallel.communicator="nccl" (train.device=cpu, pipeline
// stages), as one-line errors: choose_communicator's first checks, which validate_layout (and so
// `moecore plan`) makes too.
void check_communicator_layout(const RunConfig& config);

}  // namespace moecore
