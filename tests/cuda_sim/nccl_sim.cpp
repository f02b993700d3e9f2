// cudasim's NCCL (nccl.h and nccl_device.h say what it emulates). Ranks are processes on one
// machine. A communicator is a file every rank maps (in the temporary directory, named after the
// unique id, unlinked once all have joined): counters for the device API's barriers, and one ring
// buffer per ordered pair of ranks that carries the pair's messages in the order they were issued.
// Every message starts with a header naming its operation and size, which the receiver checks
// against its own; a mismatch is two ranks that issued different operations, which NCCL would
// hang on or corrupt, and here ends the process with one line naming both. A rank that stops (its
// communicator aborted, or an operand outside the device's memory) marks the file, and a peer
// that waits for it stops too, instead of waiting for ever; so does a peer that waits longer than
// CUDASIM_NCCL_TIMEOUT_S seconds (600 by default) without any progress.
#include <fcntl.h>
#include <nccl.h>
#include <nccl_device.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sim_state.h"

namespace cudasim::nccl {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRingBytes = 256 * 1024;
constexpr uint32_t kMaxBarriers = 1024;

// What each message's header names, so that a receive can tell which operation sent it.
enum class OpKind : uint64_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kSendRecv,
  kSplit,
  kWindowRegister,
  kWindowMapped,
  kWindowDeregister,
  kDevCommCreate,
  kDevCommDestroy,
};

const char* op_name(uint64_t kind) {
  switch (static_cast<OpKind>(kind)) {
    case OpKind::kAllReduce:
      return "ncclAllReduce";
    case OpKind::kBroadcast:
      return "ncclBroadcast";
    case OpKind::kAllGather:
      return "ncclAllGather";
    case OpKind::kReduceScatter:
      return "ncclReduceScatter";
    case OpKind::kSendRecv:
      return "ncclSend/ncclRecv";
    case OpKind::kSplit:
      return "ncclCommSplit";
    case OpKind::kWindowRegister:
    case OpKind::kWindowMapped:
      return "ncclCommWindowRegister";
    case OpKind::kWindowDeregister:
      return "ncclCommWindowDeregister";
    case OpKind::kDevCommCreate:
      return "ncclDevCommCreate";
    case OpKind::kDevCommDestroy:
      return "ncclDevCommDestroy";
  }
  return "an unknown operation";
}

// The shared file: this header, a channel per ordered pair of ranks (head written by the sender,
// tail by the receiver, on cache lines of their own), then the rings.
struct Header {
  uint64_t joined;
  uint64_t stopped;  // 1 + the rank that stopped, or 0
  uint64_t barriers[kMaxBarriers];
};
struct alignas(64) Channel {
  alignas(64) uint64_t head;
  alignas(64) uint64_t tail;
};
struct MessageHeader {
  uint64_t kind;
  uint64_t bytes;
};

size_t segment_bytes(int ranks) {
  const size_t pairs = static_cast<size_t>(ranks) * static_cast<size_t>(ranks);
  return sizeof(Header) + pairs * sizeof(Channel) + pairs * kRingBytes;
}

std::atomic_ref<uint64_t> shared(uint64_t& word) {
  return std::atomic_ref<uint64_t>(word);
}

thread_local std::string last_error;

ncclResult_t failure(ncclResult_t status, const std::string& message) {
  last_error = "cudasim: " + message;
  return status;
}

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "cudasim: NCCL: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

double timeout_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("CUDASIM_NCCL_TIMEOUT_S");
    return text != nullptr ? std::atof(text) : 600.0;
  }();
  return seconds;
}

}  // namespace

class Comm {
 public:
  Comm(std::string name, int rank, int ranks, char* segment)
      : name_(std::move(name)), rank_(rank), ranks_(ranks), segment_(segment) {}
  ~Comm() { munmap(segment_, segment_bytes(ranks_)); }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  Header& header() const { return *reinterpret_cast<Header*>(segment_); }
  Channel& channel(int from, int to) const {
    return reinterpret_cast<Channel*>(segment_ + sizeof(Header))[from * ranks_ + to];
  }
  char* ring(int from, int to) const {
    const size_t pairs = static_cast<size_t>(ranks_) * static_cast<size_t>(ranks_);
    return segment_ + sizeof(Header) + pairs * sizeof(Channel) +
           static_cast<size_t>(from * ranks_ + to) * kRingBytes;
  }

  // Marks the file so that the peers stop instead of waiting for this rank.
  void stop() { shared(header().stopped).store(static_cast<uint64_t>(rank_) + 1); }
  // Ends the process when a peer stopped.
  void check_peers(const char* waiting_for) const {
    const uint64_t stopped = shared(header().stopped).load(std::memory_order_acquire);
    if (stopped != 0 && stopped != static_cast<uint64_t>(rank_) + 1)
      fatal("rank " + std::to_string(rank_) + " of communicator " + name_ + " waits in " +
            waiting_for + " for rank " + std::to_string(stopped - 1) +
            ", which stopped (its communicator aborted, or its device failed)");
  }

  int next_split = 0;         // the splits made so far: the next one's file name
  uint32_t next_barrier = 0;  // the LSA barriers handed to device communicators so far
  std::vector<uint64_t> barrier_epochs = std::vector<uint64_t>(kMaxBarriers, 0);

 private:
  std::string name_;
  int rank_;
  int ranks_;
  char* segment_;
};

namespace {

// Waits with a yield at first, then short sleeps (the ranks may share fewer cores than they
// are); ends the process when a peer stopped or nothing moved for the timeout.
class Waiter {
 public:
  Waiter(const Comm& comm, const char* what) : comm_(comm), what_(what) {}
  void progressed() {
    spins_ = 0;
    since_ = std::chrono::steady_clock::now();
  }
  void idle() {
    comm_.check_peers(what_);
    if (++spins_ < 100) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    if (waited > timeout_seconds())
      fatal("rank " + std::to_string(comm_.rank()) + " of communicator " + comm_.name() +
            " waited " + std::to_string(static_cast<int>(waited)) + " s in " + what_ +
            " without progress (a peer never issued the matching operation)");
  }

 private:
  const Comm& comm_;
  const char* what_;
  int spins_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

// One message to or from a peer: a header, then the bytes.
struct Transfer {
  Comm* comm;
  int peer;
  bool send;
  char* data;  // read for a send, written for a receive
  size_t bytes;
  OpKind kind;
  MessageHeader header{};
  size_t moved = 0;  // of header and bytes

  size_t total() const { return sizeof(MessageHeader) + bytes; }
  bool done() const { return moved == total(); }
  // Where the next bytes of the message come from or go to, and how many are contiguous.
  char* cursor(size_t& contiguous) {
    if (moved < sizeof(MessageHeader)) {
      contiguous = sizeof(MessageHeader) - moved;
      return reinterpret_cast<char*>(&header) + moved;
    }
    contiguous = total() - moved;
    return data + (moved - sizeof(MessageHeader));
  }
};

void copy_into_ring(char* ring, uint64_t position, const char* from, size_t n) {
  const size_t offset = position % kRingBytes, first = std::min(n, kRingBytes - offset);
  std::memcpy(ring + offset, from, first);
  std::memcpy(ring, from + first, n - first);
}
void copy_from_ring(const char* ring, uint64_t position, char* to, size_t n) {
  const size_t offset = position % kRingBytes, first = std::min(n, kRingBytes - offset);
  std::memcpy(to, ring + offset, first);
  std::memcpy(to + first, ring, n - first);
}

// Moves what the ring lets through; true when anything moved.
bool progress(Transfer& t) {
  Comm& c = *t.comm;
  const int from = t.send ? c.rank() : t.peer, to = t.send ? t.peer : c.rank();
  Channel& channel = c.channel(from, to);
  char* ring = c.ring(from, to);
  uint64_t head =
      shared(channel.head).load(t.send ? std::memory_order_relaxed : std::memory_order_acquire);
  uint64_t tail =
      shared(channel.tail).load(t.send ? std::memory_order_acquire : std::memory_order_relaxed);
  size_t room = t.send ? kRingBytes - (head - tail) : head - tail;
  bool moved = false;
  while (room > 0 && !t.done()) {
    const bool had_header = t.moved >= sizeof(MessageHeader);
    size_t contiguous = 0;
    char* at = t.cursor(contiguous);
    const size_t n = std::min(contiguous, room);
    if (t.send) {
      copy_into_ring(ring, head, at, n);
      head += n;
    } else {
      copy_from_ring(ring, tail, at, n);
      tail += n;
    }
    t.moved += n;
    room -= n;
    moved = true;
    if (!t.send && !had_header && t.moved >= sizeof(MessageHeader) &&
        (t.header.kind != static_cast<uint64_t>(t.kind) || t.header.bytes != t.bytes))
      fatal("rank " + std::to_string(c.rank()) + " of communicator " + c.name() + " expected " +
            op_name(static_cast<uint64_t>(t.kind)) + "'s " + std::to_string(t.bytes) +
            " bytes from rank " + std::to_string(t.peer) + ", which sent " +
            op_name(t.header.kind) + "'s " + std::to_string(t.header.bytes) +
            ": the ranks issued different operations");
  }
  if (moved) {
    if (t.send)
      shared(channel.head).store(head, std::memory_order_release);
    else
      shared(channel.tail).store(tail, std::memory_order_release);
  }
  return moved;
}

// Moves every transfer to its end, together (as NCCL progresses a group's sends and receives).
void run_transfers(std::vector<Transfer>& transfers, const char* what) {
  if (transfers.empty()) return;
  for (Transfer& t : transfers)
    if (t.send) t.header = {static_cast<uint64_t>(t.kind), t.bytes};
  Waiter waiter(*transfers.front().comm, what);
  for (;;) {
    bool all_done = true, moved = false;
    for (Transfer& t : transfers) {
      if (t.done()) continue;
      moved = progress(t) || moved;
      all_done = all_done && t.done();
    }
    if (all_done) return;
    if (moved) {
      waiter.progressed();
    } else {
      for (const Transfer& t : transfers) t.comm->check_peers(what);
      waiter.idle();
    }
  }
}

// Every rank's `bytes` at `mine` into `all` (rank r's at r * bytes), on the host.
void allgather_now(Comm& comm, OpKind kind, const void* mine, size_t bytes, char* all) {
  std::memcpy(all + static_cast<size_t>(comm.rank()) * bytes, mine, bytes);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < comm.ranks(); ++peer) {
    if (peer == comm.rank()) continue;
    transfers.push_back(
        {&comm, peer, true, const_cast<char*>(static_cast<const char*>(mine)), bytes, kind});
    transfers.push_back({&comm, peer, false, all + static_cast<size_t>(peer) * bytes, bytes, kind});
  }
  run_transfers(transfers, op_name(static_cast<uint64_t>(kind)));
}

// ---- Communicators' files.

std::string new_name(const char* what) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t nonce = std::random_device{}();
  char name[96];
  std::snprintf(name, sizeof name, "cudasim-nccl-%s-%d-%llu-%llx", what, static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter++), static_cast<unsigned long long>(nonce));
  return name;
}

fs::path shared_path(const std::string& name) {
  return fs::temp_directory_path() / name;
}

// Maps `path` (created by the first to come, of `bytes`); null with last_error set on failure.
char* map_shared_file(const fs::path& path, size_t bytes, bool create) {
  const int fd = open(path.c_str(), create ? O_RDWR | O_CREAT : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// Joins the communicator `name` of `ranks` as `rank`: every rank maps its file, and the first to
// see all of them joined removes the name.
ncclResult_t join(ncclComm_t* out, const std::string& name, int ranks, int rank) {
  const size_t bytes = segment_bytes(ranks);
  char* segment = nullptr;
  const fs::path path = shared_path(name);
  if (ranks == 1) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    segment = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  } else {
    segment = map_shared_file(path, bytes, true);
  }
  if (segment == nullptr)
    return failure(ncclSystemError, "cannot map the communicator's file " + path.string() + ": " +
                                        std::strerror(errno));
  auto* comm = new Comm(name, rank, ranks, segment);
  shared(comm->header().joined).fetch_add(1);
  Waiter waiter(*comm, "ncclCommInitRank");
  while (shared(comm->header().joined).load() < static_cast<uint64_t>(ranks)) waiter.idle();
  if (ranks > 1 && rank == 0) fs::remove(path);
  *out = reinterpret_cast<ncclComm_t>(comm);
  return ncclSuccess;
}

Comm* comm_of(ncclComm_t comm) {
  return reinterpret_cast<Comm*>(comm);
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
  return 0;
}

template <typename T>
void reduce_typed(char* into, const char* from, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, into + i * sizeof(T), sizeof(T));
    std::memcpy(&b, from + i * sizeof(T), sizeof(T));
    const T r = op == ncclSum   ? static_cast<T>(a + b)
                : op == ncclMax ? std::max(a, b)
                : op == ncclMin ? std::min(a, b)
                                : static_cast<T>(a * b);
    std::memcpy(into + i * sizeof(T), &r, sizeof(T));
  }
}

// The reductions emulated: sum, product, max and min of the integer and fp32/fp64 types (the
// 16-bit floats NCCL also reduces are not: nothing here reduces them).
bool reducible(ncclDataType_t type, ncclRedOp_t op) {
  return op != ncclAvg && type != ncclFloat16 && type != ncclBfloat16 && type_bytes(type) > 0;
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
      return;
  }
}

// ---- Stream work.

// An operand the device must reach: inside a live device allocation, or the rank stops with an
// illegal address (and its peers with it).
struct Operand {
  const void* data;
  size_t bytes;
};

bool operands_reachable(Comm& comm, const char* op, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands) {
    if (o.bytes == 0 || inside_device_allocation(o.data, o.bytes)) continue;
    comm.stop();
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
    comm.stop();
    return failure(ncclUnhandledCudaError, "the device failed before this operation");
  }
  issue_stream_work(stream, std::move(work));
  return ncclSuccess;
}

// The point-to-point operations of the group under way on this thread (ncclGroupStart).
struct PendingP2p {
  Comm* comm;
  int peer;
  bool send;
  char* data;
  size_t bytes;
  cudaStream_t stream;
};
thread_local int group_depth = 0;
thread_local std::vector<PendingP2p> group_ops;

ncclResult_t issue_p2p(std::vector<PendingP2p> ops) {
  if (ops.empty()) return ncclSuccess;
  for (const PendingP2p& op : ops)
    if (op.stream != ops.front().stream)
      return failure(ncclInvalidUsage, "a group's operations on different streams");
  Comm& first = *ops.front().comm;
  return issue(first, ops.front().stream, [ops] {
    std::vector<Transfer> transfers;
    for (const PendingP2p& op : ops) {
      if (!operands_reachable(*op.comm, op.send ? "ncclSend" : "ncclRecv", {{op.data, op.bytes}}))
        return;
      transfers.push_back({op.comm, op.peer, op.send, op.data, op.bytes, OpKind::kSendRecv});
    }
    run_transfers(transfers, "ncclSend/ncclRecv");
  });
}

ncclResult_t check_comm(ncclComm_t comm, const char* call) {
  if (comm == nullptr) return failure(ncclInvalidArgument, std::string(call) + ": null comm");
  if (group_depth > 0)
    return failure(ncclInvalidUsage, std::string(call) +
                                         " inside ncclGroupStart/End (only sends and receives are "
                                         "grouped here)");
  return ncclSuccess;
}

// Removes the files of symmetric memory still allocated when the process ends.
struct MemoryFiles {
  std::mutex mutex;
  std::map<void*, std::pair<std::string, size_t>> files;  // mapping -> its file and its bytes
  ~MemoryFiles() {
    for (const auto& [p, file] : files) fs::remove(shared_path(file.first));
  }
};
MemoryFiles& memory_files() {
  static MemoryFiles files;
  return files;
}

size_t page_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max<size_t>((bytes + page - 1) / page * page, page);
}

// What every rank says of its window when registering it.
struct WindowRecord {
  char file[200];
  uint64_t bytes;
};

}  // namespace

void lsa_barrier(Comm* comm, ncclLsaBarrierHandle handle, uint32_t index) {
  if (index >= handle.count)
    fatal("LSA barrier " + std::to_string(index) + " of a device communicator given " +
          std::to_string(handle.count));
  const uint32_t slot = handle.first + index;
  uint64_t& arrivals = comm->header().barriers[slot];
  const uint64_t target = static_cast<uint64_t>(comm->ranks()) * ++comm->barrier_epochs[slot];
  shared(arrivals).fetch_add(1, std::memory_order_acq_rel);
  Waiter waiter(*comm, "an LSA barrier");
  while (shared(arrivals).load(std::memory_order_acquire) < target) waiter.idle();
}

}  // namespace cudasim::nccl

using cudasim::nccl::Comm;
using cudasim::nccl::comm_of;
using cudasim::nccl::failure;
using cudasim::nccl::OpKind;
using cudasim::nccl::Transfer;

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  *unique_id = {};
  const std::string name = cudasim::nccl::new_name("comm");
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
  return cudasim::nccl::join(comm, cudasim::nccl::new_name("single"), 1, 0);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm_of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm_of(comm)->stop();
  delete comm_of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* /*config*/) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclCommSplit"); r != ncclSuccess)
    return r;
  Comm& parent = *comm_of(comm);
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(parent.ranks()));
  cudasim::nccl::allgather_now(parent, OpKind::kSplit, mine, sizeof mine,
                               reinterpret_cast<char*>(all.data()));
  const int split = parent.next_split++;
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
  return cudasim::nccl::last_error.c_str();
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommCount: null comm");
  *count = comm_of(comm)->ranks();
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "ncclCommUserRank: null comm");
  *rank = comm_of(comm)->rank();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclAllReduce"); r != ncclSuccess)
    return r;
  if (!cudasim::nccl::reducible(datatype, op))
    return failure(ncclInvalidArgument, "ncclAllReduce: a reduction cudasim does not emulate");
  Comm* c = comm_of(comm);
  const size_t bytes = count * cudasim::nccl::type_bytes(datatype);
  if (bytes == 0) return ncclSuccess;
  return cudasim::nccl::issue(*c, stream, [=] {
    if (!cudasim::nccl::operands_reachable(*c, "ncclAllReduce",
                                           {{sendbuff, bytes}, {recvbuff, bytes}}))
      return;
    // Every rank's contribution, then their reduction in rank order: the same bits everywhere.
    const size_t ranks = static_cast<size_t>(c->ranks());
    std::vector<char> all(ranks * bytes);
    cudasim::nccl::allgather_now(*c, OpKind::kAllReduce, sendbuff, bytes, all.data());
    for (size_t r = 1; r < ranks; ++r)
      cudasim::nccl::reduce(all.data(), all.data() + r * bytes, count, datatype, op);
    std::memcpy(recvbuff, all.data(), bytes);
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclBroadcast"); r != ncclSuccess)
    return r;
  Comm* c = comm_of(comm);
  if (root < 0 || root >= c->ranks())
    return failure(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root));
  const size_t bytes = count * cudasim::nccl::type_bytes(datatype);
  if (bytes == 0) return ncclSuccess;
  return cudasim::nccl::issue(*c, stream, [=] {
    const bool is_root = c->rank() == root;
    if (!cudasim::nccl::operands_reachable(
            *c, "ncclBroadcast",
            {{is_root ? sendbuff : nullptr, is_root ? bytes : 0}, {recvbuff, bytes}}))
      return;
    std::vector<Transfer> transfers;
    if (is_root) {
      for (int peer = 0; peer < c->ranks(); ++peer)
        if (peer != root)
          transfers.push_back({c, peer, true, const_cast<char*>(static_cast<const char*>(sendbuff)),
                               bytes, OpKind::kBroadcast});
    } else {
      transfers.push_back(
          {c, root, false, static_cast<char*>(recvbuff), bytes, OpKind::kBroadcast});
    }
    cudasim::nccl::run_transfers(transfers, "ncclBroadcast");
    if (is_root && recvbuff != sendbuff) std::memmove(recvbuff, sendbuff, bytes);
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclAllGather"); r != ncclSuccess)
    return r;
  Comm* c = comm_of(comm);
  const size_t bytes = sendcount * cudasim::nccl::type_bytes(datatype);
  if (bytes == 0) return ncclSuccess;
  return cudasim::nccl::issue(*c, stream, [=] {
    const size_t ranks = static_cast<size_t>(c->ranks());
    if (!cudasim::nccl::operands_reachable(*c, "ncclAllGather",
                                           {{sendbuff, bytes}, {recvbuff, ranks * bytes}}))
      return;
    std::vector<char> all(ranks * bytes);  // the send part may be recv's own (in place)
    cudasim::nccl::allgather_now(*c, OpKind::kAllGather, sendbuff, bytes, all.data());
    std::memcpy(recvbuff, all.data(), all.size());
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclReduceScatter"); r != ncclSuccess)
    return r;
  if (!cudasim::nccl::reducible(datatype, op))
    return failure(ncclInvalidArgument, "ncclReduceScatter: a reduction cudasim does not emulate");
  Comm* c = comm_of(comm);
  const size_t bytes = recvcount * cudasim::nccl::type_bytes(datatype);
  if (bytes == 0) return ncclSuccess;
  return cudasim::nccl::issue(*c, stream, [=] {
    const size_t ranks = static_cast<size_t>(c->ranks()), me = static_cast<size_t>(c->rank());
    if (!cudasim::nccl::operands_reachable(*c, "ncclReduceScatter",
                                           {{sendbuff, ranks * bytes}, {recvbuff, bytes}}))
      return;
    // Part r of every rank's send goes to rank r, which reduces them in rank order.
    const char* send = static_cast<const char*>(sendbuff);
    std::vector<char> parts(ranks * bytes);
    std::memcpy(parts.data() + me * bytes, send + me * bytes, bytes);
    std::vector<Transfer> transfers;
    for (size_t peer = 0; peer < ranks; ++peer) {
      if (peer == me) continue;
      transfers.push_back({c, static_cast<int>(peer), true, const_cast<char*>(send + peer * bytes),
                           bytes, OpKind::kReduceScatter});
      transfers.push_back({c, static_cast<int>(peer), false, parts.data() + peer * bytes, bytes,
                           OpKind::kReduceScatter});
    }
    cudasim::nccl::run_transfers(transfers, "ncclReduceScatter");
    for (size_t r = 1; r < ranks; ++r)
      cudasim::nccl::reduce(parts.data(), parts.data() + r * bytes, recvcount, datatype, op);
    std::memcpy(recvbuff, parts.data(), bytes);
  });
}

namespace {

ncclResult_t point_to_point(bool send, void* data, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  const char* call = send ? "ncclSend" : "ncclRecv";
  if (comm == nullptr) return failure(ncclInvalidArgument, std::string(call) + ": null comm");
  Comm* c = comm_of(comm);
  if (peer < 0 || peer >= c->ranks())
    return failure(ncclInvalidArgument, std::string(call) + ": peer " + std::to_string(peer));
  const size_t bytes = count * cudasim::nccl::type_bytes(datatype);
  cudasim::nccl::PendingP2p op{c, peer, send, static_cast<char*>(data), bytes, stream};
  if (cudasim::nccl::group_depth > 0) {
    cudasim::nccl::group_ops.push_back(op);
    return ncclSuccess;
  }
  return cudasim::nccl::issue_p2p({op});
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++cudasim::nccl::group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (cudasim::nccl::group_depth == 0)
    return failure(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--cudasim::nccl::group_depth > 0) return ncclSuccess;
  std::vector<cudasim::nccl::PendingP2p> ops;
  ops.swap(cudasim::nccl::group_ops);
  return cudasim::nccl::issue_p2p(std::move(ops));
}

// ---- Symmetric memory and the device API.

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  const std::string file = cudasim::nccl::new_name("memory");
  const size_t mapped = cudasim::nccl::page_rounded(size);
  char* p = cudasim::nccl::map_shared_file(cudasim::nccl::shared_path(file), mapped, true);
  if (p == nullptr)
    return failure(ncclSystemError,
                   "ncclMemAlloc of " + std::to_string(size) + " bytes: " + std::strerror(errno));
  cudasim::register_device_memory(p, size);
  auto& files = cudasim::nccl::memory_files();
  const std::lock_guard lock(files.mutex);
  files.files[p] = {file, mapped};
  *ptr = p;
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  auto& files = cudasim::nccl::memory_files();
  const std::lock_guard lock(files.mutex);
  const auto it = files.files.find(ptr);
  if (it == files.files.end())
    return failure(ncclInvalidArgument, "ncclMemFree of memory ncclMemAlloc did not allocate");
  cudasim::unregister_device_memory(ptr);
  munmap(ptr, it->second.second);
  std::filesystem::remove(cudasim::nccl::shared_path(it->second.first));
  files.files.erase(it);
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int win_flags) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclCommWindowRegister");
      r != ncclSuccess)
    return r;
  if ((win_flags & NCCL_WIN_COLL_SYMMETRIC) == 0)
    return failure(ncclInvalidArgument,
                   "ncclCommWindowRegister: cudasim emulates symmetric windows only");
  Comm& c = *comm_of(comm);
  cudasim::nccl::WindowRecord mine{};
  {
    auto& files = cudasim::nccl::memory_files();
    const std::lock_guard lock(files.mutex);
    const auto it = files.files.find(buff);
    if (it == files.files.end() || size > it->second.second)
      return failure(ncclInvalidArgument,
                     "ncclCommWindowRegister: the buffer is not one ncclMemAlloc allocated, of "
                     "at least the window's size");
    std::snprintf(mine.file, sizeof mine.file, "%s", it->second.first.c_str());
    mine.bytes = size;
  }
  const size_t ranks = static_cast<size_t>(c.ranks());
  std::vector<cudasim::nccl::WindowRecord> all(ranks);
  cudasim::nccl::allgather_now(c, OpKind::kWindowRegister, &mine, sizeof mine,
                               reinterpret_cast<char*>(all.data()));
  for (size_t r = 0; r < ranks; ++r)
    if (all[r].bytes != size)
      return failure(ncclInvalidArgument,
                     "ncclCommWindowRegister: a symmetric window of " + std::to_string(size) +
                         " bytes on rank " + std::to_string(c.rank()) + " and of " +
                         std::to_string(all[r].bytes) + " on rank " + std::to_string(r));
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
    window->base[r] = cudasim::nccl::map_shared_file(cudasim::nccl::shared_path(all[r].file),
                                                     cudasim::nccl::page_rounded(size), false);
    if (window->base[r] == nullptr)
      cudasim::nccl::fatal("ncclCommWindowRegister cannot map rank " + std::to_string(r) +
                           "'s window " + all[r].file + ": " + std::strerror(errno));
  }
  // Nobody frees its memory (and removes its file) before every peer has mapped it.
  std::vector<char> mapped(ranks);
  const char yes = 1;
  cudasim::nccl::allgather_now(c, OpKind::kWindowMapped, &yes, 1, mapped.data());
  *win = window;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclCommWindowDeregister");
      r != ncclSuccess)
    return r;
  Comm& c = *comm_of(comm);
  std::vector<char> all(static_cast<size_t>(c.ranks()));
  const char yes = 1;
  cudasim::nccl::allgather_now(c, OpKind::kWindowDeregister, &yes, 1, all.data());
  for (int r = 0; r < win->ranks; ++r)
    if (r != win->rank) munmap(win->base[r], cudasim::nccl::page_rounded(win->bytes));
  cudaFree(win);
  return ncclSuccess;
}

ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* requirements,
                               ncclDevComm_t* out_dev_comm) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclDevCommCreate"); r != ncclSuccess)
    return r;
  Comm& c = *comm_of(comm);
  const int64_t count = requirements->lsaBarrierCount;
  if (count < 0 || c.next_barrier + count > cudasim::nccl::kMaxBarriers)
    return failure(ncclInvalidArgument, "ncclDevCommCreate: " + std::to_string(count) +
                                            " LSA barriers (cudasim has " +
                                            std::to_string(cudasim::nccl::kMaxBarriers) + ")");
  std::vector<int64_t> counts(static_cast<size_t>(c.ranks()));
  cudasim::nccl::allgather_now(c, OpKind::kDevCommCreate, &count, sizeof count,
                               reinterpret_cast<char*>(counts.data()));
  for (const int64_t other : counts)
    if (other != count)
      return failure(ncclInvalidArgument,
                     "ncclDevCommCreate: ranks asked for different numbers "
                     "of LSA barriers");
  *out_dev_comm = {};
  out_dev_comm->rank = out_dev_comm->lsaRank = c.rank();
  out_dev_comm->nRanks = out_dev_comm->lsaSize = c.ranks();
  out_dev_comm->lsaBarrier = {c.next_barrier, static_cast<uint32_t>(count)};
  out_dev_comm->simComm = &c;
  c.next_barrier += static_cast<uint32_t>(count);
  return ncclSuccess;
}

ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* /*dev_comm*/) {
  if (const ncclResult_t r = cudasim::nccl::check_comm(comm, "ncclDevCommDestroy");
      r != ncclSuccess)
    return r;
  Comm& c = *comm_of(comm);
  std::vector<char> all(static_cast<size_t>(c.ranks()));
  const char yes = 1;
  cudasim::nccl::allgather_now(c, OpKind::kDevCommDestroy, &yes, 1, all.data());
  return ncclSuccess;
}

ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  const Comm& c = *comm_of(comm);
  return {c.ranks(), c.rank(), 1};
}
