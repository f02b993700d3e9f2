// cudasim's NCCL: the host API's communicators and operations (nccl.h says what is emulated; the
// messages move through nccl_sim_transport.h's rings, the symmetric memory and device API are
// nccl_sim_symmetric.cpp's). Every operation is stream work: it runs when issued, or is recorded by
// a capture and runs at each replay. Arguments are checked when issued, as NCCL's are (a data type
// or reduction it lacks; buffers that overlap other than exactly in place, where the GPU would
// race); operands when the work runs (they must be in the device's memory). Reductions gather
// every rank's contribution and add them in rank order, so every rank gets the same bits.
#include <nccl.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nccl_sim_transport.h"
#include "sim_state.h"

namespace cudasim::nccl {
namespace {

ncclResult_t join(ncclComm_t* out, const std::string& name, int ranks, int rank) {
  Comm* comm = Comm::join(name, ranks, rank);
  if (comm == nullptr) return ncclSystemError;
  *out = reinterpret_cast<ncclComm_t>(comm);
  return ncclSuccess;
}

// ---- Data types and reductions.

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;  // not a data type
}

// Integers add as NCCL's do, wrapping (in their unsigned type: a signed overflow is undefined in
// C++), and take the larger as their own type.
template <typename T>
struct Wrapping {
  using type = T;
};
template <std::integral T>
struct Wrapping<T> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
void reduce_typed(char* into, const char* from, size_t count, ncclRedOp_t op) {
  using Sum = typename Wrapping<T>::type;
  for (size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, into + i * sizeof(T), sizeof(T));
    std::memcpy(&b, from + i * sizeof(T), sizeof(T));
    const T r =
        op == ncclSum ? static_cast<T>(static_cast<Sum>(a) + static_cast<Sum>(b)) : std::max(a, b);
    std::memcpy(into + i * sizeof(T), &r, sizeof(T));
  }
}

// The reductions emulated: sums and maxima of the integers, fp32 and fp64 (the communicator's).
// The rest of NCCL's (products, minima, averages, 16-bit floats) are refused in one line.
bool reducible(ncclDataType_t type, ncclRedOp_t op) {
  return (op == ncclSum || op == ncclMax) && type != ncclFloat16 && type != ncclBfloat16 &&
         type_bytes(type) > 0;
}

void reduce(char* into, const char* from, size_t count, ncclDataType_t type, ncclRedOp_t op) {
  switch (type) {
    case ncclInt8:
      return reduce_typed<int8_t>(into, from, count, op);
    case ncclUint8:
      return reduce_typed<uint8_t>(into, from, count, op);
    case ncclInt32:
      return reduce_typed<int32_t>(into, from, count, op);
    case ncclUint32:
      return reduce_typed<uint32_t>(into, from, count, op);
    case ncclInt64:
      return reduce_typed<int64_t>(into, from, count, op);
    case ncclUint64:
      return reduce_typed<uint64_t>(into, from, count, op);
    case ncclFloat32:
      return reduce_typed<float>(into, from, count, op);
    case ncclFloat64:
      return reduce_typed<double>(into, from, count, op);
    case ncclFloat16:
    case ncclBfloat16:
      fatal("a reduction of 16-bit floats, which reducible() refuses");
  }
}

// The arguments every rank must give alike, in each message's header.
uint64_t detail(ncclDataType_t type, ncclRedOp_t op = ncclSum, int root = -1) {
  return static_cast<uint64_t>(type) | static_cast<uint64_t>(op) << 8 |
         static_cast<uint64_t>(root + 1) << 16;
}

// ---- Checks when issued.

// Two buffers that overlap, unless `in_place` (the overlap NCCL allows) holds.
bool overlap_not_in_place(const void* a, size_t a_bytes, const void* b, size_t b_bytes,
                          bool in_place) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return !in_place && pa < pb + b_bytes && pb < pa + a_bytes;
}

ncclResult_t refuse_overlap(const char* call) {
  return failure(
      ncclInvalidArgument,
      std::string(call) + ": its buffers overlap other than in place (the GPU would race on them)");
}

// ---- Stream work.

// The operands must lie in the device's memory; otherwise the device's illegal address, and the
// rank fails (its peers with it).
struct Operand {
  const void* data;
  size_t bytes;
};

bool operands_reachable(Comm& comm, const char* op, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands) {
    if (o.bytes == 0 || inside_device_allocation(o.data, o.bytes)) continue;
    comm.fail();
    char where[64];
    std::snprintf(where, sizeof where, "%p", o.data);
    record_error(cudaErrorIllegalAddress, true,
                 std::string(op) + " on communicator " + comm.name() + ": " +
                     std::to_string(o.bytes) + " bytes at " + where +
                     " are not in the device's memory");
    return false;
  }
  return true;
}

// Issues `work` on `stream`, or refuses it when the device already failed (its peers are told).
ncclResult_t issue(Comm& comm, cudaStream_t stream, std::function<void()> work) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capture);
  if (capture == cudaStreamCaptureStatusNone && has_sticky_error()) {
    comm.fail();
    return failure(ncclUnhandledCudaError, "the device failed before this operation");
  }
  issue_stream_work(stream, std::move(work));
  return ncclSuccess;
}

// The sends and receives of the group under way on this thread (ncclGroupStart).
struct PendingP2p {
  Comm* comm;
  int peer;
  bool send;
  char* data;
  size_t bytes;
  ncclDataType_t type;
  cudaStream_t stream;
};
thread_local int group_depth = 0;
thread_local std::vector<PendingP2p> group_ops;

ncclResult_t issue_p2p(std::vector<PendingP2p> ops) {
  if (ops.empty()) return ncclSuccess;
  for (const PendingP2p& op : ops)
    if (op.stream != ops.front().stream)
      return failure(ncclInvalidUsage, "a group's operations on different streams");
  return issue(*ops.front().comm, ops.front().stream, [ops] {
    std::vector<Transfer> transfers;
    for (const PendingP2p& op : ops) {
      if (!operands_reachable(*op.comm, op.send ? "ncclSend" : "ncclRecv", {{op.data, op.bytes}}))
        return;
      transfers.push_back(
          {op.comm, op.peer, op.send, op.data, op.bytes, OpKind::kSendRecv, detail(op.type)});
    }
    run_transfers(transfers, "ncclSend/ncclRecv");
  });
}

ncclResult_t check_call(ncclComm_t comm, const char* call) {
  if (comm == nullptr) return failure(ncclInvalidArgument, std::string(call) + ": null comm");
  if (group_depth > 0)
    return failure(ncclInvalidUsage,
                   std::string(call) +
                       " inside ncclGroupStart/End (only sends and receives are grouped here)");
  return ncclSuccess;
}

ncclResult_t point_to_point(bool send, void* data, size_t count, ncclDataType_t type, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  const std::string call = send ? "ncclSend" : "ncclRecv";
  if (comm == nullptr) return failure(ncclInvalidArgument, call + ": null comm");
  Comm* c = Comm::of(comm);
  if (peer < 0 || peer >= c->ranks())
    return failure(ncclInvalidArgument, call + ": peer " + std::to_string(peer));
  if (type_bytes(type) == 0) return failure(ncclInvalidArgument, call + ": not a data type");
  const PendingP2p op{c,    peer,  send, static_cast<char*>(data), count * type_bytes(type),
                      type, stream};
  if (group_depth > 0) {
    group_ops.push_back(op);
    return ncclSuccess;
  }
  return issue_p2p({op});
}

}  // namespace
}  // namespace cudasim::nccl

using cudasim::nccl::Comm;
using cudasim::nccl::failure;
using cudasim::nccl::OpKind;
using cudasim::nccl::Transfer;

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  *unique_id = {};
  const std::string name = cudasim::nccl::unique_name("comm");
  std::memcpy(unique_id->internal, name.data(),
              std::min(name.size(), sizeof unique_id->internal - 1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  if (nranks < 1 || nranks > cudasim::nccl::kMaxRanks || rank < 0 || rank >= nranks)
    return failure(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                            std::to_string(nranks) + " (at most " +
                                            std::to_string(cudasim::nccl::kMaxRanks) + " ranks)");
  comm_id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
  if (std::strncmp(comm_id.internal, "cudasim-nccl-", 13) != 0)
    return failure(ncclInvalidArgument, "ncclCommInitRank: not an id of ncclGetUniqueId");
  return cudasim::nccl::join(comm, comm_id.internal, nranks, rank);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (ndev != 1 || (devlist != nullptr && devlist[0] != 0))
    return failure(ncclInvalidArgument,
                   "ncclCommInitAll: the emulated GPU is one device per process (" +
                       std::to_string(ndev) + " devices asked)");
  return cudasim::nccl::join(comm, cudasim::nccl::unique_name("single"), 1, 0);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete Comm::of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  Comm::of(comm)->fail();
  delete Comm::of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* /*config*/) {
  if (const ncclResult_t r = cudasim::nccl::check_call(comm, "ncclCommSplit"); r != ncclSuccess)
    return r;
  Comm& parent = *Comm::of(comm);
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(parent.ranks()));
  cudasim::nccl::allgather_now(parent, OpKind::kSplit, mine, sizeof mine,
                               reinterpret_cast<char*>(all.data()));
  const int split = parent.take_split_index();
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  // The members: the ranks of this color, by key, then by their rank in the parent.
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < parent.ranks(); ++r)
    if (all[2 * static_cast<size_t>(r)] == color)
      members.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
  std::sort(members.begin(), members.end());
  int rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == parent.rank()) rank = static_cast<int>(i);
  // Named after the parent, the split and the color: the same name on every member.
  const std::string name =
      parent.name() + "-s" + std::to_string(split) + "c" + std::to_string(color);
  return cudasim::nccl::join(newcomm, name, static_cast<int>(members.size()), rank);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t /*comm*/) {
  return cudasim::nccl::last_error();
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommCount: null comm");
  *count = Comm::of(comm)->ranks();
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommUserRank: null comm");
  *rank = Comm::of(comm)->rank();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  using namespace cudasim::nccl;
  if (const ncclResult_t r = check_call(comm, "ncclAllReduce"); r != ncclSuccess) return r;
  if (!reducible(datatype, op))
    return failure(ncclInvalidArgument, "ncclAllReduce: a reduction cudasim does not emulate");
  const size_t bytes = count * type_bytes(datatype);
  if (overlap_not_in_place(sendbuff, bytes, recvbuff, bytes, sendbuff == recvbuff))
    return refuse_overlap("ncclAllReduce");
  if (bytes == 0) return ncclSuccess;
  Comm* c = Comm::of(comm);
  return issue(*c, stream, [=] {
    if (!operands_reachable(*c, "ncclAllReduce", {{sendbuff, bytes}, {recvbuff, bytes}})) return;
    const size_t ranks = static_cast<size_t>(c->ranks());
    std::vector<char> all(ranks * bytes);
    allgather_now(*c, OpKind::kAllReduce, sendbuff, bytes, all.data());
    for (size_t r = 1; r < ranks; ++r)
      reduce(all.data(), all.data() + r * bytes, count, datatype, op);
    std::memcpy(recvbuff, all.data(), bytes);
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  using namespace cudasim::nccl;
  if (const ncclResult_t r = check_call(comm, "ncclBroadcast"); r != ncclSuccess) return r;
  Comm* c = Comm::of(comm);
  if (root < 0 || root >= c->ranks())
    return failure(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root));
  if (type_bytes(datatype) == 0)
    return failure(ncclInvalidArgument, "ncclBroadcast: not a data type");
  const size_t bytes = count * type_bytes(datatype);
  const bool is_root = c->rank() == root;
  if (is_root && overlap_not_in_place(sendbuff, bytes, recvbuff, bytes, sendbuff == recvbuff))
    return refuse_overlap("ncclBroadcast");
  if (bytes == 0) return ncclSuccess;
  return issue(*c, stream, [=] {
    if (!operands_reachable(*c, "ncclBroadcast",
                            {{sendbuff, is_root ? bytes : 0}, {recvbuff, bytes}}))
      return;
    std::vector<Transfer> transfers;
    for (int peer = 0; peer < c->ranks(); ++peer)
      if (is_root && peer != root)
        transfers.push_back({c, peer, true, const_cast<char*>(static_cast<const char*>(sendbuff)),
                             bytes, OpKind::kBroadcast, detail(datatype, ncclSum, root)});
    if (!is_root)
      transfers.push_back({c, root, false, static_cast<char*>(recvbuff), bytes, OpKind::kBroadcast,
                           detail(datatype, ncclSum, root)});
    run_transfers(transfers, "ncclBroadcast");
    if (is_root && recvbuff != sendbuff) std::memcpy(recvbuff, sendbuff, bytes);
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  using namespace cudasim::nccl;
  if (const ncclResult_t r = check_call(comm, "ncclAllGather"); r != ncclSuccess) return r;
  if (type_bytes(datatype) == 0)
    return failure(ncclInvalidArgument, "ncclAllGather: not a data type");
  Comm* c = Comm::of(comm);
  const size_t bytes = sendcount * type_bytes(datatype);
  const size_t ranks = static_cast<size_t>(c->ranks());
  // In place: the send buffer is this rank's part of the receive buffer.
  const bool in_place =
      sendbuff == static_cast<char*>(recvbuff) + static_cast<size_t>(c->rank()) * bytes;
  if (overlap_not_in_place(sendbuff, bytes, recvbuff, ranks * bytes, in_place))
    return refuse_overlap("ncclAllGather");
  if (bytes == 0) return ncclSuccess;
  return issue(*c, stream, [=] {
    if (!operands_reachable(*c, "ncclAllGather", {{sendbuff, bytes}, {recvbuff, ranks * bytes}}))
      return;
    allgather_now(*c, OpKind::kAllGather, sendbuff, bytes, static_cast<char*>(recvbuff));
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  using namespace cudasim::nccl;
  if (const ncclResult_t r = check_call(comm, "ncclReduceScatter"); r != ncclSuccess) return r;
  if (!reducible(datatype, op))
    return failure(ncclInvalidArgument, "ncclReduceScatter: a reduction cudasim does not emulate");
  Comm* c = Comm::of(comm);
  const size_t bytes = recvcount * type_bytes(datatype);
  const size_t ranks = static_cast<size_t>(c->ranks()), me = static_cast<size_t>(c->rank());
  // In place: the receive buffer is this rank's part of the send buffer.
  const bool in_place = recvbuff == static_cast<const char*>(sendbuff) + me * bytes;
  if (overlap_not_in_place(sendbuff, ranks * bytes, recvbuff, bytes, in_place))
    return refuse_overlap("ncclReduceScatter");
  if (bytes == 0) return ncclSuccess;
  return issue(*c, stream, [=] {
    if (!operands_reachable(*c, "ncclReduceScatter",
                            {{sendbuff, ranks * bytes}, {recvbuff, bytes}}))
      return;
    // Part r of every rank's send goes to rank r, which reduces them in rank order.
    const char* send = static_cast<const char*>(sendbuff);
    std::vector<char> parts(ranks * bytes);
    std::memcpy(parts.data() + me * bytes, send + me * bytes, bytes);
    std::vector<Transfer> transfers;
    for (size_t peer = 0; peer < ranks; ++peer) {
      if (peer == me) continue;
      const int p = static_cast<int>(peer);
      transfers.push_back({c, p, true, const_cast<char*>(send + peer * bytes), bytes,
                           OpKind::kReduceScatter, detail(datatype, op)});
      transfers.push_back({c, p, false, parts.data() + peer * bytes, bytes, OpKind::kReduceScatter,
                           detail(datatype, op)});
    }
    run_transfers(transfers, "ncclReduceScatter");
    for (size_t r = 1; r < ranks; ++r)
      reduce(parts.data(), parts.data() + r * bytes, recvcount, datatype, op);
    std::memcpy(recvbuff, parts.data(), bytes);
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return cudasim::nccl::point_to_point(true, const_cast<void*>(sendbuff), count, datatype, peer,
                                       comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return cudasim::nccl::point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++cudasim::nccl::group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  using namespace cudasim::nccl;
  if (group_depth == 0) return failure(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<PendingP2p> ops;
  ops.swap(group_ops);
  return issue_p2p(std::move(ops));
}
