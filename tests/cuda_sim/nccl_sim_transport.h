// cudasim's NCCL, its transport (nccl_sim_transport.cpp): ranks are processes on one machine and
// share files in the temporary directory. A communicator is one such file, which every rank maps:
// each rank's state, counters for the device API's barriers, and one ring buffer per ordered pair
// of ranks carrying the pair's messages in the order they were issued. Every message starts with a
// header naming its operation, size and arguments, which the receiver checks against its own; a
// mismatch is two ranks that issued different operations, which NCCL would hang on or corrupt, and
// here ends the process with one line naming both. A send is complete once its receiver has read
// it all (NCCL's point-to-point blocks the GPU until its peer's match). A rank that ends its
// communicator, or fails, says so in the file, and a peer that waits for it then ends too; so does
// a rank that waits CUDASIM_NCCL_TIMEOUT_S seconds (600 by default) with nothing moving.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cudasim::nccl {

inline constexpr size_t kRingBytes = 256 * 1024;
inline constexpr uint32_t kMaxBarriers = 1024;

// What a message's header names, so that a receive can tell which operation sent it.
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
const char* op_name(OpKind kind);

// A name no other process or call uses: "cudasim-nccl-<what>-<pid>-<count>-<nonce>", for
// unique ids and for the files of symmetric memory.
std::string unique_name(const char* what);

// What an NCCL call returns on a misuse it detects, with ncclGetLastError's text.
ncclResult_t failure(ncclResult_t status, const std::string& message);
const char* last_error();
// Ends the process with one line on stderr, after marking every communicator of this process
// failed (so that its peers end too) and removing the files it shared.
[[noreturn]] void fatal(const std::string& message);

struct Header;  // a communicator file's start (nccl_sim_transport.cpp)

class Comm {
 public:
  // Joins the communicator `name` of `ranks` as `rank`: maps its file (created by the first rank
  // to come) and waits for every rank; the file's name is removed once all have joined. A group of
  // one maps anonymous memory. Null, with last_error() set, when the file cannot be mapped.
  static Comm* join(const std::string& name, int ranks, int rank);
  // The communicator behind NCCL's handle (ncclCommInitRank hands out Comm pointers).
  static Comm* of(ncclComm_t comm) { return reinterpret_cast<Comm*>(comm); }
  // Leaves the communicator: its peers see it gone. A message from a peer left unread is two ranks
  // that issued different operations, and ends the process.
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

  // Marks this rank failed (ncclCommAbort, an operand outside the device's memory): the peers that
  // wait for it end instead of waiting.
  void fail();
  // Ends the process when `peer` has failed or left (-1: any peer) while this rank waits for it.
  void check_peer(int peer, const char* waiting_for) const;

  // The index of this communicator's next split (the same on every rank: splits are collective).
  int take_split_index() { return splits_++; }
  // The first of `count` LSA barriers for a device communicator, or -1 when too few are left.
  int64_t take_barriers(uint32_t count);
  // Meets barrier `slot` of every rank (its next use on this rank).
  void meet_at_barrier(uint32_t slot);

  // A message's way between two ranks of the communicator.
  struct Channel {
    uint64_t* head;  // bytes written in all, by the sender
    uint64_t* tail;  // bytes read in all, by the receiver
    char* ring;
  };
  Channel channel(int from, int to) const;

 private:
  Comm(std::string name, int rank, int ranks, char* segment);
  Header& header() const;  // the file's start

  std::string name_;
  int rank_;
  int ranks_;
  char* segment_;
  int splits_ = 0;
  uint32_t barriers_taken_ = 0;
  std::vector<uint64_t> barrier_uses_ = std::vector<uint64_t>(kMaxBarriers, 0);
};

// One message to or from a peer: a header, then `bytes`. `detail` is the operation's arguments the
// peers must agree on (data type, reduction, root), checked with its kind and size.
struct Transfer {
  Comm* comm;
  int peer;
  bool send;
  char* data;  // read for a send, written for a receive
  size_t bytes;
  OpKind kind;
  uint64_t detail = 0;
};

// Moves every transfer to its end, together, as NCCL progresses a group's sends and receives; the
// transfers on one channel in their order.
void run_transfers(const std::vector<Transfer>& transfers, const char* what);
// Every rank's `bytes` at `mine` into `all` (rank r's at r * bytes), now.
void allgather_now(Comm& comm, OpKind kind, const void* mine, size_t bytes, char* all);

// Files of memory shared with the peers (ncclMemAlloc's): a new one of `bytes` mapped here, its
// name for the peers; a peer's mapped; this process's own unmapped and removed. Whatever is left
// is removed at the process's end, and by fatal().
void* map_new_shared_file(size_t bytes, std::string& name);
void* map_peer_file(const std::string& name, size_t bytes);
// The name and mapped size of a file map_new_shared_file made at `p`; false if none.
bool shared_file_of(const void* p, std::string& name, size_t& bytes);
bool unmap_shared_file(void* p);
size_t page_rounded(size_t bytes);

}  // namespace cudasim::nccl
