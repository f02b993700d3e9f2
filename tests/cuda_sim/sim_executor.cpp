// cudasim's kernel executor: a launch's blocks run one after the other on the calling thread, and
// each CUDA thread of a block is a fiber with its own stack. A fiber runs until it
// reaches __syncthreads, a warp collective or its end; when no fiber can run, the scheduler
// releases a warp whose lanes have all reached the same collective, or the block once all its
// threads wait at the same barrier. Anything else (a barrier some threads skip or reach at
// another call, a collective a lane has left, a deadlock) fails the launch with a message that
// names the kernel, the block and what each thread waits for: the hardware's behaviour there is
// undefined, so the emulation refuses it rather than guessing.
//
// Threads run in thread-index order, or in reverse with CUDASIM_THREAD_ORDER=reverse: a kernel
// whose result depends on the order (a race between barriers) gives different results in the two.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sim_state.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

// The switch between fibers: saves the callee-saved registers and the floating-point control
// words on the current stack, stores its pointer in *save, and resumes the stack `next` as it was
// saved (x86-64 System V). A kernel launch switches a few times per thread and barrier, millions
// of times in a test run: glibc's swapcontext makes a system call each time (the signal mask),
// which made the suite thirty times slower.
extern "C" void cudasim_switch_stack(void** save, void* next);
asm(R"(
  .pushsection .text
  .globl cudasim_switch_stack
  .type cudasim_switch_stack, @function
cudasim_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr (%rsp)
  fnstcw 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cudasim_switch_stack, .-cudasim_switch_stack
  .popsection
)");

namespace cudasim {
namespace {

// Enough for the kernels' locals (a warp matrix fragment is a whole tile per lane here) with
// AddressSanitizer's redzones; pages are touched only as used. A guard page below each stack
// turns an overflow into a fault instead of another fiber's data.
constexpr size_t kStackBytes = 512 * 1024;
constexpr size_t kGuardBytes = 4096;

enum class Wait { kRunnable, kBarrier, kWarp, kDone };

struct Fiber {
  void* saved_stack = nullptr;  // where cudasim_switch_stack left it
  char* stack = nullptr;        // kStackBytes, above its guard page
  void* asan_fake_stack = nullptr;
  ThreadCoordinates coordinates{};
  int linear = 0;  // x fastest, then y, then z
  Wait wait = Wait::kRunnable;
  const char* barrier_file = nullptr;  // the __syncthreads call's place
  int barrier_line = 0;
  unsigned int warp_mask = 0;
  WarpCollective collective = WarpCollective::kShuffle;
  uint64_t offered = 0, received = 0;
  int source_lane = 0;
};

// The block being run on this host thread.
struct BlockRun {
  Fiber* current = nullptr;
  void* scheduler_saved_stack = nullptr;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;
  const std::function<void()>* body = nullptr;
  void* dynamic_shared = nullptr;
  size_t dynamic_shared_bytes = 0;
  // The block's __shared__ objects seen so far (filled with 0xff by the first thread to declare
  // each) and their bytes, for the launch's shared memory limit.
  std::set<const void*> shared_objects;
  size_t static_shared_bytes = 0;
  size_t shared_limit_bytes = kDefaultSharedBytes;  // static and dynamic together
  std::string fault;  // the first rule the block's device code broke (report_fault)
};

thread_local BlockRun* running = nullptr;

// Fibers' stacks, kept for the next launches (mapped once per thread of the largest block).
std::vector<char*>& stack_pool() {
  static thread_local std::vector<char*> pool;
  return pool;
}

char* stack_for(size_t index) {
  std::vector<char*>& pool = stack_pool();
  while (pool.size() <= index) {
    void* mapped = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
      std::fprintf(stderr, "cudasim: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(mapped, kGuardBytes, PROT_NONE);
    pool.push_back(static_cast<char*>(mapped) + kGuardBytes);
  }
  return pool[index];
}

// Leaves the running fiber for the scheduler; returns when the scheduler resumes it (never, when
// `exiting`).
void yield_to_scheduler(bool exiting) {
  BlockRun& run = *running;
  Fiber& fiber = *run.current;
#if CUDASIM_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fiber.asan_fake_stack, run.scheduler_stack,
                                 run.scheduler_stack_bytes);
#else
  (void)exiting;
#endif
  cudasim_switch_stack(&fiber.saved_stack, run.scheduler_saved_stack);
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(fiber.asan_fake_stack, &run.scheduler_stack,
                                  &run.scheduler_stack_bytes);
#endif
}

// A fiber's whole life. Device code does not throw; should a kernel's host-side helper do so,
// the process ends here naming the exception (nothing could unwind past the fiber's first frame).
void fiber_main() noexcept {
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &running->scheduler_stack,
                                  &running->scheduler_stack_bytes);
#endif
  try {
    (*running->body)();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudasim: a kernel's thread threw: %s\n", e.what());
    std::abort();
  }
  running->current->wait = Wait::kDone;
  yield_to_scheduler(/*exiting=*/true);
}

// A fresh stack as cudasim_switch_stack would have left it, about to return into fiber_main: the
// control words (the host's), six zero registers, the return address; fiber_main then starts with
// the stack aligned as after a call (rsp = 8 mod 16).
void* initial_stack(char* stack) {
  auto* top = reinterpret_cast<uint64_t*>(stack + kStackBytes);
  uint64_t* sp = top - 10;  // 80 bytes: 16-byte aligned
  uint32_t mxcsr = 0;
  uint16_t x87_control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87_control));
  sp[0] = mxcsr;
  sp[1] = x87_control;
  for (int r = 2; r < 8; ++r) sp[r] = 0;
  sp[8] = reinterpret_cast<uint64_t>(&fiber_main);
  sp[9] = 0;  // fiber_main's return address: it never returns
  return sp;
}

void resume(BlockRun& run, Fiber& fiber) {
  run.current = &fiber;
#if CUDASIM_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, fiber.stack, kStackBytes);
#endif
  cudasim_switch_stack(&run.scheduler_saved_stack, fiber.saved_stack);
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, &run.scheduler_stack, &run.scheduler_stack_bytes);
#endif
  run.current = nullptr;
}

const char* wait_name(const Fiber& f) {
  switch (f.wait) {
    case Wait::kRunnable:
      return "running";
    case Wait::kBarrier:
      return "__syncthreads";
    case Wait::kWarp:
      return "a warp collective";
    case Wait::kDone:
      return "exited";
  }
  return "?";
}

// What each thread waits for, grouped: "threads 0-95 at __syncthreads (site 0x...), 96-127 exited".
std::string describe_waits(const std::vector<Fiber>& fibers) {
  std::string out;
  size_t i = 0;
  while (i < fibers.size()) {
    size_t j = i;
    while (j + 1 < fibers.size() && fibers[j + 1].wait == fibers[i].wait &&
           fibers[j + 1].barrier_line == fibers[i].barrier_line &&
           fibers[j + 1].barrier_file == fibers[i].barrier_file)
      ++j;
    char part[160];
    std::snprintf(part, sizeof part, "%sthreads %zu-%zu %s", out.empty() ? "" : ", ", i, j,
                  wait_name(fibers[i]));
    out += part;
    if (fibers[i].wait == Wait::kBarrier) {
      std::snprintf(part, sizeof part, " at %s:%d", fibers[i].barrier_file, fibers[i].barrier_line);
      out += part;
    }
    i = j + 1;
  }
  return out;
}

// Releases the lanes of every warp collective all of whose lanes have arrived; false when none
// could be, with `failure` set where a collective can never complete.
bool release_warps(std::vector<Fiber>& fibers, std::string& failure) {
  bool released = false;
  const int threads = static_cast<int>(fibers.size());
  for (Fiber& f : fibers) {
    if (f.wait != Wait::kWarp) continue;
    const int warp_base = f.linear / 32 * 32;
    bool complete = true;
    for (int lane = 0; lane < 32 && complete; ++lane) {
      if ((f.warp_mask >> lane & 1u) == 0) continue;
      const int t = warp_base + lane;
      if (t >= threads) {
        failure = "a warp collective's mask names lane " + std::to_string(lane) +
                  ", which this block (of " + std::to_string(threads) + " threads) lacks";
        return false;
      }
      const Fiber& other = fibers[static_cast<size_t>(t)];
      if (other.wait == Wait::kWarp &&
          (other.warp_mask != f.warp_mask || other.collective != f.collective)) {
        failure =
            "lanes of one warp wait at different warp collectives (a shuffle and a "
            "__syncwarp, or other masks)";
        return false;
      }
      if (other.wait != Wait::kWarp) complete = false;
    }
    if (!complete) continue;
    for (int lane = 0; lane < 32; ++lane) {
      if ((f.warp_mask >> lane & 1u) == 0) continue;
      Fiber& member = fibers[static_cast<size_t>(warp_base + lane)];
      const int source = member.source_lane;
      if (source < 0 || source >= 32 || (f.warp_mask >> source & 1u) == 0) {
        failure = "a shuffle reads lane " + std::to_string(source) + ", outside its mask";
        return false;
      }
      member.received = fibers[static_cast<size_t>(warp_base + source)].offered;
    }
    for (int lane = 0; lane < 32; ++lane)
      if ((f.warp_mask >> lane & 1u) != 0)
        fibers[static_cast<size_t>(warp_base + lane)].wait = Wait::kRunnable;
    released = true;
  }
  return released;
}

// Releases the block when every thread waits at the same __syncthreads.
bool release_barrier(std::vector<Fiber>& fibers, std::string& failure) {
  for (const Fiber& f : fibers) {
    if (f.wait != Wait::kBarrier) {
      failure = "not every thread reached the barrier: " + describe_waits(fibers);
      return false;
    }
    if (f.barrier_line != fibers.front().barrier_line ||
        std::strcmp(f.barrier_file, fibers.front().barrier_file) != 0) {
      failure = "threads wait at different __syncthreads calls: " + describe_waits(fibers);
      return false;
    }
  }
  for (Fiber& f : fibers) f.wait = Wait::kRunnable;
  return true;
}

bool reverse_order() {
  static const bool reverse = [] {
    const char* order = std::getenv("CUDASIM_THREAD_ORDER");
    return order != nullptr && std::strcmp(order, "reverse") == 0;
  }();
  return reverse;
}

bool run_block(BlockRun& run, std::vector<Fiber>& fibers, std::string& failure) {
  for (Fiber& f : fibers) {
#if CUDASIM_ASAN
    // A fiber a failed launch abandoned left its frames' poison on the stack reused here.
    __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
    f.wait = Wait::kRunnable;
    f.barrier_file = nullptr;
    f.barrier_line = 0;
    f.saved_stack = initial_stack(f.stack);
  }
  // Shared memory holds garbage when a block starts, on the device: all ones here, as fresh
  // global memory (and never what the previous block left).
  if (run.dynamic_shared_bytes > 0) std::memset(run.dynamic_shared, 0xff, run.dynamic_shared_bytes);
  run.shared_objects.clear();
  run.static_shared_bytes = 0;
  run.fault.clear();
  const size_t n = fibers.size();
  for (;;) {
    bool ran = false;
    for (size_t k = 0; k < n; ++k) {
      Fiber& f = fibers[reverse_order() ? n - 1 - k : k];
      if (f.wait == Wait::kRunnable) {
        resume(run, f);
        ran = true;
      }
    }
    if (ran) continue;
    bool all_done = true;
    for (const Fiber& f : fibers) all_done = all_done && f.wait == Wait::kDone;
    if (all_done) {
      failure = run.fault;
      return failure.empty();
    }
    if (release_warps(fibers, failure)) continue;
    if (!failure.empty()) return false;
    bool any_warp = false;
    for (const Fiber& f : fibers) any_warp = any_warp || f.wait == Wait::kWarp;
    if (any_warp) {
      failure = "a warp collective some lanes never reach: " + describe_waits(fibers);
      return false;
    }
    if (!release_barrier(fibers, failure)) return false;
  }
}

}  // namespace

const ThreadCoordinates& coordinates() {
  if (running == nullptr || running->current == nullptr) {
    std::fprintf(stderr, "cudasim: threadIdx or blockIdx read outside a kernel\n");
    std::abort();
  }
  return running->current->coordinates;
}

void* dynamic_shared_memory() {
  return running->dynamic_shared;
}

int lane_id() {
  return running->current->linear % 32;
}

uint64_t warp_exchange(WarpCollective collective, unsigned int mask, uint64_t bits,
                       int source_lane) {
  Fiber& f = *running->current;
  f.wait = Wait::kWarp;
  f.warp_mask = mask;
  f.collective = collective;
  f.offered = bits;
  f.source_lane = source_lane;
  yield_to_scheduler(/*exiting=*/false);
  return f.received;
}

void report_fault(const std::string& what) {
  if (running->fault.empty()) running->fault = what;
}

void declare_shared(void* object, size_t bytes, const char* name) {
  BlockRun& run = *running;
  if (!run.shared_objects.insert(object).second) return;
  std::memset(object, 0xff, bytes);
  run.static_shared_bytes += bytes;
  if (run.static_shared_bytes + run.dynamic_shared_bytes > run.shared_limit_bytes)
    report_fault("__shared__ " + std::string(name) + ": " +
                 std::to_string(run.static_shared_bytes) + " bytes of static and " +
                 std::to_string(run.dynamic_shared_bytes) +
                 " of dynamic shared memory exceed the block's " +
                 std::to_string(run.shared_limit_bytes) + " bytes");
}

bool execute_launch(const LaunchShape& shape, const std::function<void()>& body,
                    std::string& failure) {
  const size_t threads = size_t{shape.block.x} * shape.block.y * shape.block.z;
  std::vector<Fiber> fibers(threads);
  for (size_t i = 0; i < threads; ++i) fibers[i].stack = stack_for(i);
  // Exactly the bytes asked for, so that a read past them is a heap overflow under ASan, at the
  // device's alignment of dynamic shared memory (WMMA's loads need 32 bytes).
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> dynamic(
      shape.shared_bytes > 0 ? std::aligned_alloc(128, (shape.shared_bytes + 127) / 128 * 128)
                             : nullptr);
  BlockRun run;
  run.body = &body;
  run.dynamic_shared = dynamic.get();
  run.dynamic_shared_bytes = shape.shared_bytes;
  run.shared_limit_bytes = max_dynamic_shared_bytes(shape.kernel) > kDefaultSharedBytes
                               ? kOptInSharedBytes
                               : kDefaultSharedBytes;
  BlockRun* const outer = running;
  running = &run;
  bool ok = true;
  for (unsigned int bz = 0; bz < shape.grid.z && ok; ++bz)
    for (unsigned int by = 0; by < shape.grid.y && ok; ++by)
      for (unsigned int bx = 0; bx < shape.grid.x && ok; ++bx) {
        size_t i = 0;
        for (unsigned int tz = 0; tz < shape.block.z; ++tz)
          for (unsigned int ty = 0; ty < shape.block.y; ++ty)
            for (unsigned int tx = 0; tx < shape.block.x; ++tx, ++i) {
              fibers[i].coordinates = {{tx, ty, tz}, {bx, by, bz}, shape.block, shape.grid};
              fibers[i].linear = static_cast<int>(i);
            }
        std::string why;
        if (!run_block(run, fibers, why)) {
          char where[96];
          std::snprintf(where, sizeof where, " (block %u,%u,%u of %u,%u,%u)", bx, by, bz,
                        shape.grid.x, shape.grid.y, shape.grid.z);
          failure = std::string(shape.kernel_name) + where + ": " + why;
          ok = false;
        }
      }
  running = outer;
  return ok;
}

}  // namespace cudasim

void cudasim::sync_threads(const char* file, int line) {
  Fiber& f = *running->current;
  f.wait = Wait::kBarrier;
  f.barrier_file = file;
  f.barrier_line = line;
  yield_to_scheduler(/*exiting=*/false);
}

void __syncwarp(unsigned int mask) {
  cudasim::warp_exchange(cudasim::WarpCollective::kSyncWarp, mask, 0, cudasim::lane_id());
}
