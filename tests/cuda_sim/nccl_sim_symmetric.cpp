// cudasim's NCCL: symmetric memory and the device API's load/store team (nccl_device.h says how a
// kernel reaches a peer's memory). ncclMemAlloc's memory is a file of its own, mapped here and
// entered as the device's; a symmetric window maps every peer's file into this process. The calls
// that are collective in NCCL (window registration and deregistration, device communicators'
// creation and destruction) exchange a message with every peer here too, so that a rank that
// skips one, or makes them in another order, is caught as a mismatch.
#include <nccl.h>
#include <nccl_device.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "nccl_sim_transport.h"
#include "sim_state.h"

using cudasim::nccl::Comm;
using cudasim::nccl::failure;
using cudasim::nccl::OpKind;

namespace {

// What every rank says of its window when registering it: its memory's file, its size, and
// whether its own arguments were right (checked by every rank before any fails, so that all fail
// together instead of leaving their peers waiting).
struct WindowRecord {
  char file[200];
  uint64_t bytes;
  uint64_t valid;
};

// A barrier with every peer: a message to and from each.
void meet_peers(Comm& comm, OpKind kind) {
  std::vector<char> all(static_cast<size_t>(comm.ranks()));
  const char here = 1;
  cudasim::nccl::allgather_now(comm, kind, &here, 1, all.data());
}

}  // namespace

namespace cudasim::nccl {

void lsa_barrier(Comm* comm, ncclLsaBarrierHandle handle, uint32_t index) {
  if (index >= handle.count)
    fatal("LSA barrier " + std::to_string(index) + " of a device communicator given " +
          std::to_string(handle.count));
  comm->meet_at_barrier(handle.first + index);
}

void window_out_of_bounds(size_t offset, size_t bytes) {
  fatal("a pointer " + std::to_string(offset) + " bytes into a symmetric window of " +
        std::to_string(bytes));
}

}  // namespace cudasim::nccl

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  std::string name;
  void* p = cudasim::nccl::map_new_shared_file(size, name);
  if (p == nullptr)
    return failure(ncclSystemError,
                   "ncclMemAlloc of " + std::to_string(size) + " bytes: " + std::strerror(errno));
  cudasim::register_device_memory(p, size);  // fresh: every byte 0xff
  *ptr = p;
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  if (!cudasim::nccl::unmap_shared_file(ptr))
    return failure(ncclInvalidArgument, "ncclMemFree of memory ncclMemAlloc did not allocate");
  cudasim::unregister_device_memory(ptr);
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int win_flags) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommWindowRegister: null comm");
  Comm& c = *Comm::of(comm);
  WindowRecord mine{};
  std::string file;
  size_t mapped = 0;
  const bool symmetric = (win_flags & NCCL_WIN_COLL_SYMMETRIC) != 0;
  const bool allocated = cudasim::nccl::shared_file_of(buff, file, mapped) && size <= mapped;
  std::snprintf(mine.file, sizeof mine.file, "%s", file.c_str());
  mine.bytes = size;
  mine.valid = symmetric && allocated;
  const size_t ranks = static_cast<size_t>(c.ranks());
  std::vector<WindowRecord> all(ranks);
  cudasim::nccl::allgather_now(c, OpKind::kWindowRegister, &mine, sizeof mine,
                               reinterpret_cast<char*>(all.data()));
  if (!symmetric)
    return failure(ncclInvalidArgument,
                   "ncclCommWindowRegister: cudasim emulates symmetric windows only");
  if (!allocated)
    return failure(ncclInvalidArgument,
                   "ncclCommWindowRegister: the buffer is not one ncclMemAlloc allocated, of at "
                   "least the window's size");
  for (size_t r = 0; r < ranks; ++r) {
    if (all[r].valid == 0)
      return failure(ncclInvalidArgument,
                     "ncclCommWindowRegister: rank " + std::to_string(r) + "'s arguments failed");
    if (all[r].bytes != size)
      return failure(ncclInvalidArgument,
                     "ncclCommWindowRegister: a symmetric window of " + std::to_string(size) +
                         " bytes on rank " + std::to_string(c.rank()) + " and of " +
                         std::to_string(all[r].bytes) + " on rank " + std::to_string(r));
  }
  // The handle in the device's memory, as NCCL's is: a kernel takes it as an argument.
  void* handle = nullptr;
  if (cudaMalloc(&handle, sizeof(ncclWindow_vidmem)) != cudaSuccess)
    return failure(ncclUnhandledCudaError, "ncclCommWindowRegister: cudaMalloc of the handle");
  auto* window = new (handle) ncclWindow_vidmem{};
  window->bytes = size;
  window->ranks = c.ranks();
  window->rank = c.rank();
  for (size_t r = 0; r < ranks; ++r) {
    if (r == static_cast<size_t>(c.rank())) {
      window->base[r] = static_cast<char*>(buff);
      continue;
    }
    all[r].file[sizeof all[r].file - 1] = 0;
    window->base[r] = static_cast<char*>(cudasim::nccl::map_peer_file(all[r].file, size));
    if (window->base[r] == nullptr)
      cudasim::nccl::fatal("ncclCommWindowRegister cannot map rank " + std::to_string(r) +
                           "'s window " + all[r].file + ": " + std::strerror(errno));
  }
  // No rank frees its memory (and removes its file) before every peer has mapped it.
  meet_peers(c, OpKind::kWindowMapped);
  *win = window;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommWindowDeregister: null comm");
  meet_peers(*Comm::of(comm), OpKind::kWindowDeregister);  // collective in NCCL
  for (int r = 0; r < win->ranks; ++r)
    if (r != win->rank) munmap(win->base[r], cudasim::nccl::page_rounded(win->bytes));
  cudaFree(win);
  return ncclSuccess;
}

ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* requirements,
                               ncclDevComm_t* out_dev_comm) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclDevCommCreate: null comm");
  Comm& c = *Comm::of(comm);
  // Every rank must ask for as many barriers, and gets the same ones (creation is collective).
  const int64_t count = requirements->lsaBarrierCount;
  std::vector<int64_t> counts(static_cast<size_t>(c.ranks()));
  cudasim::nccl::allgather_now(c, OpKind::kDevCommCreate, &count, sizeof count,
                               reinterpret_cast<char*>(counts.data()));
  for (const int64_t other : counts)
    if (other != count)
      return failure(ncclInvalidArgument,
                     "ncclDevCommCreate: ranks asked for different numbers of LSA barriers");
  const int64_t first = count < 0 ? -1 : c.take_barriers(static_cast<uint32_t>(count));
  if (first < 0)
    return failure(ncclInvalidArgument,
                   "ncclDevCommCreate: " + std::to_string(count) +
                       " LSA barriers more than the communicator has left (cudasim gives each "
                       "communicator " +
                       std::to_string(cudasim::nccl::kMaxBarriers) + ", never taken back)");
  *out_dev_comm = {};
  out_dev_comm->rank = out_dev_comm->lsaRank = c.rank();
  out_dev_comm->nRanks = out_dev_comm->lsaSize = c.ranks();
  out_dev_comm->lsaBarrier = {static_cast<uint32_t>(first), static_cast<uint32_t>(count)};
  out_dev_comm->simComm = &c;
  return ncclSuccess;
}

ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* /*dev_comm*/) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclDevCommDestroy: null comm");
  meet_peers(*Comm::of(comm), OpKind::kDevCommDestroy);  // collective in NCCL
  return ncclSuccess;
}

ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  const Comm& c = *Comm::of(comm);
  return {c.ranks(), c.rank(), 1};
}
