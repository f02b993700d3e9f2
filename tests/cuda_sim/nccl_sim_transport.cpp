// cudasim's NCCL transport (nccl_sim_transport.h says what it is).
#include "nccl_sim_transport.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace cudasim::nccl {

// The communicator's file: this header, then a channel's words per ordered pair of ranks (head
// written by the sender, tail by the receiver, each on a cache line of its own), then the rings.
struct alignas(64) Header {
  uint64_t joined;
  uint64_t rank_state[kMaxRanks];
  uint64_t barrier_arrivals[kMaxBarriers];
};

namespace {

namespace fs = std::filesystem;

// What each rank of a communicator is, in its file.
enum RankState : uint64_t { kMember = 0, kLeft = 1, kFailed = 2 };

struct alignas(64) ChannelWords {
  alignas(64) uint64_t head;
  alignas(64) uint64_t tail;
};
struct MessageHeader {
  uint64_t kind;
  uint64_t bytes;
  uint64_t detail;
};

size_t pairs(int ranks) {
  return static_cast<size_t>(ranks) * static_cast<size_t>(ranks);
}
size_t segment_bytes(int ranks) {
  return sizeof(Header) + pairs(ranks) * (sizeof(ChannelWords) + kRingBytes);
}

// A word of the shared file as an atomic: the peers read and write it from their processes.
std::atomic_ref<uint64_t> atomic_word(uint64_t& word) {
  return std::atomic_ref<uint64_t>(word);
}

thread_local std::string last_error_text;

double timeout_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("CUDASIM_NCCL_TIMEOUT_S");
    return text != nullptr ? std::atof(text) : 600.0;
  }();
  return seconds;
}

// The communicators of this process, which fatal() marks failed, and the files it shares, which
// go at its end (an atexit handler: the state itself is never destroyed, so that a communicator a
// static object destroys late still finds it).
struct ProcessState {
  std::mutex mutex;
  std::set<Comm*> comms;
  std::map<const void*, std::pair<std::string, size_t>> shared_files;  // mapping -> name, bytes
  void remove_files() {
    for (const auto& [p, file] : shared_files) fs::remove(fs::temp_directory_path() / file.first);
  }
};
ProcessState& process() {
  static ProcessState* state = [] {
    std::atexit([] { process().remove_files(); });
    return new ProcessState;
  }();
  return *state;
}

// Waits with a yield at first, then short sleeps (the ranks may share fewer cores than they
// are); ends the process when the peer waited for stopped or nothing moved for the timeout.
class Waiter {
 public:
  Waiter(const Comm& comm, const char* what) : comm_(comm), what_(what) {}
  void progressed() {
    spins_ = 0;
    since_ = std::chrono::steady_clock::now();
  }
  void idle() {
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

// A message's operation, size and arguments (detail: the data type in the low byte, the reduction
// in the next, the root plus one above; nccl_sim.cpp's detail()).
std::string describe(uint64_t kind, uint64_t bytes, uint64_t detail) {
  std::string text =
      std::string(op_name(static_cast<OpKind>(kind))) + " of " + std::to_string(bytes) + " bytes";
  if (detail == 0) return text;
  text += " (data type " + std::to_string(detail & 0xff);
  if (kind == static_cast<uint64_t>(OpKind::kAllReduce) ||
      kind == static_cast<uint64_t>(OpKind::kReduceScatter))
    text += ", reduction " + std::to_string((detail >> 8) & 0xff);
  if ((detail >> 16) != 0) text += ", root " + std::to_string((detail >> 16) - 1);
  return text + ")";
}

// A transfer under way: how much of its header and bytes moved, and for a send where its last
// byte lies in the ring's stream (complete once the receiver's tail has passed it).
struct Progress {
  const Transfer* t;
  MessageHeader header{};
  size_t moved = 0;
  uint64_t end = 0;
  bool complete = false;

  size_t total() const { return sizeof(MessageHeader) + t->bytes; }
  bool all_moved() const { return moved == total(); }
  char* cursor(size_t& contiguous) {
    if (moved < sizeof(MessageHeader)) {
      contiguous = sizeof(MessageHeader) - moved;
      return reinterpret_cast<char*>(&header) + moved;
    }
    contiguous = total() - moved;
    return t->data + (moved - sizeof(MessageHeader));
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

// Moves what the ring lets through; true when anything moved or completed.
bool progress(Progress& p) {
  const Transfer& t = *p.t;
  const Comm& c = *t.comm;
  const Comm::Channel channel = t.send ? c.channel(c.rank(), t.peer) : c.channel(t.peer, c.rank());
  if (t.send && p.all_moved()) {  // written: complete once the receiver has read it all
    p.complete = atomic_word(*channel.tail).load(std::memory_order_acquire) >= p.end;
    return p.complete;
  }
  uint64_t head = atomic_word(*channel.head)
                      .load(t.send ? std::memory_order_relaxed : std::memory_order_acquire);
  uint64_t tail = atomic_word(*channel.tail)
                      .load(t.send ? std::memory_order_acquire : std::memory_order_relaxed);
  size_t room = t.send ? kRingBytes - (head - tail) : head - tail;
  bool moved = false;
  while (room > 0 && !p.all_moved()) {
    const bool had_header = p.moved >= sizeof(MessageHeader);
    size_t contiguous = 0;
    char* at = p.cursor(contiguous);
    const size_t n = std::min(contiguous, room);
    if (t.send) {
      copy_into_ring(channel.ring, head, at, n);
      head += n;
    } else {
      copy_from_ring(channel.ring, tail, at, n);
      tail += n;
    }
    p.moved += n;
    room -= n;
    moved = true;
    if (!t.send && !had_header && p.moved >= sizeof(MessageHeader) &&
        (p.header.kind != static_cast<uint64_t>(t.kind) || p.header.bytes != t.bytes ||
         p.header.detail != t.detail))
      fatal("rank " + std::to_string(c.rank()) + " of communicator " + c.name() + " expected " +
            describe(static_cast<uint64_t>(t.kind), t.bytes, t.detail) + " from rank " +
            std::to_string(t.peer) + ", which sent " +
            describe(p.header.kind, p.header.bytes, p.header.detail) +
            ": the ranks issued different operations");
  }
  if (moved) {
    if (t.send) {
      atomic_word(*channel.head).store(head, std::memory_order_release);
      p.end = head;
    } else {
      atomic_word(*channel.tail).store(tail, std::memory_order_release);
      p.complete = p.all_moved();
    }
  }
  return moved;
}

// Whether an earlier transfer of the list still moves bytes on the same channel: the next one
// there starts after it, as NCCL matches a pair's operations in their order.
bool waits_for_earlier(const std::vector<Progress>& progress_of, size_t i) {
  const Transfer& t = *progress_of[i].t;
  for (size_t j = 0; j < i; ++j) {
    const Transfer& e = *progress_of[j].t;
    if (e.comm == t.comm && e.peer == t.peer && e.send == t.send && !progress_of[j].all_moved())
      return true;
  }
  return false;
}

}  // namespace

const char* op_name(OpKind kind) {
  switch (kind) {
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

ncclResult_t failure(ncclResult_t status, const std::string& message) {
  last_error_text = "cudasim: " + message;
  return status;
}

const char* last_error() {
  return last_error_text.c_str();
}

void fatal(const std::string& message) {
  std::fprintf(stderr, "cudasim: NCCL: %s\n", message.c_str());
  std::fflush(stderr);
  for (Comm* comm : process().comms) comm->fail();
  process().remove_files();
  std::abort();
}

Comm::Comm(std::string name, int rank, int ranks, char* segment)
    : name_(std::move(name)), rank_(rank), ranks_(ranks), segment_(segment) {}

Header& Comm::header() const {
  return *reinterpret_cast<Header*>(segment_);
}

Comm* Comm::join(const std::string& name, int ranks, int rank) {
  const size_t bytes = segment_bytes(ranks);
  const fs::path path = fs::temp_directory_path() / name;
  void* p = MAP_FAILED;
  if (ranks == 1) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  } else {
    // Every rank sizes the file alike: the first creates it, the others find it at that size.
    const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
  }
  if (p == MAP_FAILED) {
    failure(ncclSystemError,
            "cannot map the communicator's file " + path.string() + ": " + std::strerror(errno));
    return nullptr;
  }
  auto* comm = new Comm(name, rank, ranks, static_cast<char*>(p));
  {
    const std::lock_guard lock(process().mutex);
    process().comms.insert(comm);
  }
  Header& header = comm->header();
  atomic_word(header.joined).fetch_add(1);
  Waiter waiter(*comm, "ncclCommInitRank");
  while (atomic_word(header.joined).load() < static_cast<uint64_t>(ranks)) {
    comm->check_peer(-1, "ncclCommInitRank");
    waiter.idle();
  }
  // All have the file mapped: its name can go (a later communicator gets a new one).
  if (ranks > 1 && rank == 0) fs::remove(path);
  return comm;
}

Comm::~Comm() {
  Header& header = this->header();
  if (atomic_word(header.rank_state[rank_]).load() == kMember) {
    for (int peer = 0; peer < ranks_; ++peer) {
      const Channel in = channel(peer, rank_);
      const uint64_t unread =
          atomic_word(*in.head).load(std::memory_order_acquire) - atomic_word(*in.tail).load();
      if (unread != 0)
        fatal("rank " + std::to_string(rank_) + " destroys communicator " + name_ + " with " +
              std::to_string(unread) + " bytes from rank " + std::to_string(peer) +
              " unread: the ranks issued different operations");
    }
    atomic_word(header.rank_state[rank_]).store(kLeft, std::memory_order_release);
  }
  {
    const std::lock_guard lock(process().mutex);
    process().comms.erase(this);
  }
  munmap(segment_, segment_bytes(ranks_));
}

void Comm::fail() {
  Header& header = this->header();
  atomic_word(header.rank_state[rank_]).store(kFailed, std::memory_order_release);
}

void Comm::check_peer(int peer, const char* waiting_for) const {
  Header& header = this->header();
  const int first = peer < 0 ? 0 : peer, last = peer < 0 ? ranks_ - 1 : peer;
  for (int r = first; r <= last; ++r) {
    if (r == rank_) continue;
    const uint64_t state = atomic_word(header.rank_state[r]).load(std::memory_order_acquire);
    if (state != kMember)
      fatal("rank " + std::to_string(rank_) + " of communicator " + name_ + " waits in " +
            waiting_for + " for rank " + std::to_string(r) + ", which " +
            (state == kLeft ? "destroyed its communicator"
                            : "failed (its communicator aborted, or its device failed)"));
  }
}

int64_t Comm::take_barriers(uint32_t count) {
  if (barriers_taken_ + count > kMaxBarriers) return -1;
  barriers_taken_ += count;
  return barriers_taken_ - count;
}

void Comm::meet_at_barrier(uint32_t slot) {
  Header& header = this->header();
  uint64_t& arrivals = header.barrier_arrivals[slot];
  // Every rank adds one per use, so the n-th use is over once all ranks' n-th arrivals are in.
  const uint64_t target = static_cast<uint64_t>(ranks_) * ++barrier_uses_[slot];
  atomic_word(arrivals).fetch_add(1, std::memory_order_acq_rel);
  Waiter waiter(*this, "an LSA barrier");
  while (atomic_word(arrivals).load(std::memory_order_acquire) < target) {
    check_peer(-1, "an LSA barrier");
    waiter.idle();
  }
}

Comm::Channel Comm::channel(int from, int to) const {
  const size_t index = static_cast<size_t>(from * ranks_ + to);
  auto* words = reinterpret_cast<ChannelWords*>(segment_ + sizeof(Header));
  char* rings = segment_ + sizeof(Header) + pairs(ranks_) * sizeof(ChannelWords);
  return {&words[index].head, &words[index].tail, rings + index * kRingBytes};
}

void run_transfers(const std::vector<Transfer>& transfers, const char* what) {
  if (transfers.empty()) return;
  std::vector<Progress> progress_of;
  for (const Transfer& t : transfers) {
    Progress p{&t};
    if (t.send) p.header = {static_cast<uint64_t>(t.kind), t.bytes, t.detail};
    progress_of.push_back(p);
  }
  Waiter waiter(*transfers.front().comm, what);
  for (;;) {
    bool all_complete = true, moved = false;
    for (size_t i = 0; i < progress_of.size(); ++i) {
      Progress& p = progress_of[i];
      if (p.complete) continue;
      if (!waits_for_earlier(progress_of, i)) moved = progress(p) || moved;
      all_complete = all_complete && p.complete;
    }
    if (all_complete) return;
    if (moved) {
      waiter.progressed();
      continue;
    }
    for (const Progress& p : progress_of)
      if (!p.complete) p.t->comm->check_peer(p.t->peer, what);
    waiter.idle();
  }
}

void allgather_now(Comm& comm, OpKind kind, const void* mine, size_t bytes, char* all) {
  std::memmove(all + static_cast<size_t>(comm.rank()) * bytes, mine, bytes);
  std::vector<Transfer> transfers;
  char* own = all + static_cast<size_t>(comm.rank()) * bytes;
  for (int peer = 0; peer < comm.ranks(); ++peer) {
    if (peer == comm.rank()) continue;
    transfers.push_back({&comm, peer, true, own, bytes, kind});
    transfers.push_back({&comm, peer, false, all + static_cast<size_t>(peer) * bytes, bytes, kind});
  }
  run_transfers(transfers, op_name(kind));
}

size_t page_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max<size_t>((bytes + page - 1) / page * page, page);
}

std::string unique_name(const char* what) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t nonce = std::random_device{}();
  char text[96];
  std::snprintf(text, sizeof text, "cudasim-nccl-%s-%d-%llu-%llx", what, static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter++), static_cast<unsigned long long>(nonce));
  return text;
}

void* map_new_shared_file(size_t bytes, std::string& name) {
  name = unique_name("memory");
  const size_t mapped = page_rounded(bytes);
  const fs::path path = fs::temp_directory_path() / name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(mapped)) == 0)
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    fs::remove(path);
    return nullptr;
  }
  const std::lock_guard lock(process().mutex);
  process().shared_files[p] = {name, mapped};
  return p;
}

void* map_peer_file(const std::string& name, size_t bytes) {
  const int fd = open((fs::temp_directory_path() / name).c_str(), O_RDWR);
  if (fd < 0) return nullptr;
  void* p = mmap(nullptr, page_rounded(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

bool shared_file_of(const void* p, std::string& name, size_t& bytes) {
  const std::lock_guard lock(process().mutex);
  const auto it = process().shared_files.find(p);
  if (it == process().shared_files.end()) return false;
  name = it->second.first;
  bytes = it->second.second;
  return true;
}

bool unmap_shared_file(void* p) {
  const std::lock_guard lock(process().mutex);
  const auto it = process().shared_files.find(p);
  if (it == process().shared_files.end()) return false;
  munmap(p, it->second.second);
  fs::remove(fs::temp_directory_path() / it->second.first);
  process().shared_files.erase(it);
  return true;
}

}  // namespace cudasim::nccl
