#include "guarded_device.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/device_graph.h"
#include "core/device_memory.h"
#include "core/phase_timer.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/device_backends.h"

namespace moecore::guarded_device {

namespace {

// The capture in progress (Capture), if any: where the operations go instead of running, and the
// first thing done inside it that a CUDA graph's capture cannot hold.
struct Recording {
  std::vector<std::function<void()>>* operations = nullptr;
  std::string broken;
};
Recording& recording() {
  static Recording r;
  return r;
}
bool capturing() {
  return recording().operations != nullptr;
}

uintptr_t page_size() {
  static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Opens (read and write) or closes (no access) the pages holding [data, data + bytes) when they
// are the guarded device's; host memory is left alone.
void set_access(const void* data, size_t bytes, bool open) {
  if (data == nullptr || bytes == 0 || device_of(data) != Device::kCuda) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page_size() - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + bytes + page_size() - 1) & ~(page_size() - 1);
  const int status = mprotect(reinterpret_cast<void*>(begin), end - begin,
                              open ? PROT_READ | PROT_WRITE : PROT_NONE);
  MOE_CHECK(status == 0, "[guarded device] mprotect failed: {}", std::strerror(errno));
}

class GuardedMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::kCuda; }
  void* allocate(size_t bytes) override {
    MOE_CHECK(!capturing(),
              "[guarded device] an allocation of {} bytes inside a capture: a captured step must "
              "find its buffers allocated",
              bytes);
    void* data = mmap(nullptr, mapped(bytes), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MOE_CHECK(data != MAP_FAILED, "[guarded device] mmap of {} bytes failed", bytes);
    return data;
  }
  void deallocate(void* data, size_t bytes) noexcept override {
    if (capturing() && recording().broken.empty())
      recording().broken = fmt::format("a free of {} bytes of device memory", bytes);
    munmap(data, mapped(bytes));
  }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) override {
    if (capturing()) {
      MOE_CHECK(kind == CopyKind::kWithinDevice,
                "[guarded device] a copy of {} bytes {} inside a capture: the step's inputs must "
                "be in device memory before it, and its results are read after it",
                bytes, kind == CopyKind::kHostToDevice ? "from the host" : "to the host");
      recording().operations->push_back([this, dst, src, bytes] { move(dst, src, bytes); });
      return;
    }
    if (kind == CopyKind::kHostToDevice) host_to_device_.push_back(bytes);
    move(dst, src, bytes);
  }
  void zero(void* data, size_t bytes) override {
    if (capturing()) {
      recording().operations->push_back([data, bytes] { clear(data, bytes); });
      return;
    }
    clear(data, bytes);
  }

  std::vector<size_t> take_host_to_device() { return std::exchange(host_to_device_, {}); }

 private:
  static size_t mapped(size_t bytes) { return (bytes + page_size() - 1) & ~(page_size() - 1); }
  static void move(void* dst, const void* src, size_t bytes) {
    set_access(dst, bytes, true);
    set_access(src, bytes, true);
    std::memmove(dst, src, bytes);
    set_access(src, bytes, false);
    set_access(dst, bytes, false);
  }
  static void clear(void* data, size_t bytes) {
    set_access(data, bytes, true);
    std::memset(data, 0, bytes);
    set_access(data, bytes, false);
  }
  std::vector<size_t> host_to_device_;
};

// The bytes a view spans, from its first element to its last.
template <bool kMutable>
size_t span_bytes(const BasicTensorView<kMutable>& v) {
  if (v.raw() == nullptr || v.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < v.rank(); ++d) last += (v.size(d) - 1) * v.stride(d);
  return static_cast<size_t>(last + 1) * dtype_size(v.dtype());
}

// The guarded views among an operation's arguments, opened for the call and closed after it.
class OpenViews {
 public:
  template <typename... Args>
  explicit OpenViews(const Args&... args) {
    (add(args), ...);
    for (const ConstTensorView& v : views_) set_access(v.raw(), span_bytes(v), true);
  }
  ~OpenViews() {
    for (const ConstTensorView& v : views_) set_access(v.raw(), span_bytes(v), false);
  }
  OpenViews(const OpenViews&) = delete;
  OpenViews& operator=(const OpenViews&) = delete;

 private:
  void add(const ConstTensorView& v) { views_.push_back(v); }
  void add(const TensorView& v) { views_.push_back(v); }
  void add(const MxOperandView& v) {
    views_.push_back(v.codes);
    views_.push_back(v.scales);
  }
  void add(const RouterLossGrads& g) { views_.push_back(g.lb_score_grad); }
  void add(const PaddedDispatchMaps& m) {
    for (const TensorView& v : {m.slot_of_position, m.position_of_slot, m.token_of_slot,
                                m.row_of_slot, m.slot_of_row, m.expert_offsets, m.dropped})
      views_.push_back(v);
  }
  template <typename T>
  void add(const T&) {}  // scalars, options, host spans

  std::vector<ConstTensorView> views_;
};

// The arguments as the CPU backend takes them: views relabelled as host memory (which, opened,
// they are).
template <bool kMutable>
BasicTensorView<kMutable> on_host(const BasicTensorView<kMutable>& v) {
  return v.relocated(v.raw(), Device::kCpu);
}
MxOperandView on_host(const MxOperandView& v) {
  return {on_host(v.codes), on_host(v.scales)};
}
RouterLossGrads on_host(const RouterLossGrads& g) {
  return {on_host(g.lb_score_grad), g.lb_uses_softmax, g.z_grad_scale};
}
PaddedDispatchMaps on_host(const PaddedDispatchMaps& m) {
  return {on_host(m.slot_of_position), on_host(m.position_of_slot), on_host(m.token_of_slot),
          on_host(m.row_of_slot),      on_host(m.slot_of_row),      on_host(m.expert_offsets),
          on_host(m.dropped)};
}
template <typename T>
const T& on_host(const T& value) {
  return value;
}

template <auto kOperation>
struct Guarded;
template <typename... Args, void (*kOperation)(Args...)>
struct Guarded<kOperation> {
  static void call(Args... args) {
    if (capturing()) {
      // Recorded with copies of its arguments (options passed by reference included), as a
      // kernel node keeps the values it was launched with.
      recording().operations->push_back(
          [recorded = std::tuple<std::decay_t<Args>...>(args...)] { std::apply(run, recorded); });
      return;
    }
    run(args...);
  }
  static void run(const std::decay_t<Args>&... args) {
    const OpenViews open(args...);
    kOperation(on_host(args)...);
  }
};

const kernels::KernelBackend& guarded_backend() {
  namespace cpu = kernels::cpu;
  static const kernels::KernelBackend backend{
      .name = "guarded",
      .mx_gemm_bit_exact = true,
      .matmul = &Guarded<&cpu::matmul>::call,
      .rmsnorm_forward = &Guarded<&cpu::rmsnorm_forward>::call,
      .rmsnorm_backward = &Guarded<&cpu::rmsnorm_backward>::call,
      .swiglu_forward = &Guarded<&cpu::swiglu_forward>::call,
      .swiglu_backward = &Guarded<&cpu::swiglu_backward>::call,
      .embedding_forward = &Guarded<&cpu::embedding_forward>::call,
      .embedding_backward = &Guarded<&cpu::embedding_backward>::call,
      .rope_forward = &Guarded<&cpu::rope_forward>::call,
      .rope_backward = &Guarded<&cpu::rope_backward>::call,
      .cross_entropy = &Guarded<&cpu::cross_entropy>::call,
      .adamw_update = &Guarded<&cpu::adamw_update>::call,
      .step_decision = &Guarded<&cpu::step_decision>::call,
      .sum_of_squares = &Guarded<&cpu::sum_of_squares>::call,
      .causal_attention_forward = &Guarded<&cpu::causal_attention_forward>::call,
      .causal_attention_backward = &Guarded<&cpu::causal_attention_backward>::call,
      .flash_attention_forward = &Guarded<&cpu::flash_attention_forward>::call,
      .flash_attention_backward = &Guarded<&cpu::flash_attention_backward>::call,
      .permute_rows = &Guarded<&cpu::permute_rows>::call,
      .permute_rows_backward = &Guarded<&cpu::permute_rows_backward>::call,
      .gather_rows = &Guarded<&cpu::gather_rows>::call,
      .moe_combine_forward = &Guarded<&cpu::moe_combine_forward>::call,
      .moe_combine_backward = &Guarded<&cpu::moe_combine_backward>::call,
      .order_routes_by_expert = &Guarded<&cpu::order_routes_by_expert>::call,
      .padded_dispatch_plan = &Guarded<&cpu::padded_dispatch_plan>::call,
      .router_topk_forward = &Guarded<&cpu::router_topk_forward>::call,
      .router_topk_backward = &Guarded<&cpu::router_topk_backward>::call,
      .router_z_loss = &Guarded<&cpu::router_z_loss>::call,
      .router_probability_column_sums = &Guarded<&cpu::router_probability_column_sums>::call,
      .route_counts_by_group = &Guarded<&cpu::route_counts_by_group>::call,
      .moe_loss_terms = &Guarded<&cpu::moe_loss_terms>::call,
      .router_bias_update = &Guarded<&cpu::router_bias_update>::call,
      .grouped_gemm_forward = &Guarded<&cpu::grouped_gemm_forward>::call,
      .grouped_gemm_backward = &Guarded<&cpu::grouped_gemm_backward>::call,
      .add = &Guarded<&cpu::add>::call,
      .scale = &Guarded<&cpu::scale>::call,
      .cached_attention_forward = &Guarded<&cpu::cached_attention_forward>::call,
      .to_bf16 = &Guarded<&cpu::to_bf16>::call,
      .mx_quantize = &Guarded<&cpu::mx_quantize>::call,
      .mx_quantize_transposed = &Guarded<&cpu::mx_quantize_transposed>::call,
      .mx_dequantize = &Guarded<&cpu::mx_dequantize>::call,
      .mx_matmul = &Guarded<&cpu::mx_matmul>::call,
      .mx_grouped_gemm_forward = &Guarded<&cpu::mx_grouped_gemm_forward>::call,
      .mx_grouped_gemm_backward_input = &Guarded<&cpu::mx_grouped_gemm_backward_input>::call,
  };
  return backend;
}

GuardedMemory& guarded_memory() {
  static GuardedMemory memory;
  return memory;
}

// The emulated capture as core/device_graph.h's DeviceGraphs, for code that captures through it
// (train.cuda_graph).
class GuardedGraph final : public DeviceGraph {
 public:
  explicit GuardedGraph(Graph graph) : graph_(std::move(graph)) {}
  void replay() override { graph_.replay(); }

 private:
  Graph graph_;
};

class GuardedGraphs final : public DeviceGraphs {
 public:
  void begin_capture() override { open_.emplace(); }
  std::unique_ptr<DeviceGraph> end_capture() override {
    MOE_CHECK(open_.has_value(), "[guarded device] no capture is open");
    Graph graph = open_->end();
    open_.reset();
    return std::make_unique<GuardedGraph>(std::move(graph));
  }
  void abandon_capture() noexcept override { open_.reset(); }

 private:
  std::optional<Capture> open_;
};

GuardedGraphs& guarded_graphs() {
  static GuardedGraphs graphs;
  return graphs;
}

// The device's clock of train.profile's phases (kernels/cuda/phase_clock.h on a GPU): every mark
// takes kPhaseMarkSeconds, so a profile's phase times are whole multiples of it when, and only
// when, this clock timed them. As the CUDA clock, it marks nothing inside a capture; a mark begun
// there anyway is an error, so a caller that ignores can_mark() fails.
class GuardedPhaseClock final : public DevicePhaseClock {
 public:
  const char* name() const override { return "guarded device's clock"; }
  bool can_mark() const override { return !capturing(); }
  int64_t begin(Phase phase) override {
    MOE_CHECK(!capturing(), "[guarded device] a phase marked inside a capture");
    marks_.push_back({phase, false, false});
    return static_cast<int64_t>(marks_.size() - 1);
  }
  void end(int64_t id) noexcept override {
    Mark& mark = marks_[static_cast<size_t>(id)];
    (capturing() ? mark.dropped : mark.ended) = true;  // no end inside a capture: untimed
  }
  void collect() override {
    bool open = false;
    for (Mark& mark : marks_) {
      if (mark.ended) {
        phase_timer::add(mark.phase, kPhaseMarkSeconds);
        mark = {Phase::kCount, false, false};  // counted
      }
      open |= mark.phase != Phase::kCount && !mark.dropped;
    }
    // A mark still open keeps its id until it ends: the list starts again once none is.
    if (!open) marks_.clear();
  }

 private:
  struct Mark {
    Phase phase;  // Phase::kCount once counted
    bool ended, dropped;
  };
  std::vector<Mark> marks_;
};

GuardedPhaseClock& guarded_phase_clock() {
  static GuardedPhaseClock clock;
  return clock;
}

}  // namespace

void Graph::replay() const {
  MOE_CHECK(!capturing(), "[guarded device] a replay inside a capture");
  for (const std::function<void()>& operation : operations_) operation();
}

Capture::Capture() {
  MOE_CHECK(!capturing(), "[guarded device] one capture at a time");
  recording() = {&graph_.operations_, {}};
}

Capture::~Capture() {
  if (open_) recording() = {};
}

Graph Capture::end() {
  MOE_CHECK(open_, "[guarded device] the capture has ended already");
  open_ = false;
  const std::string broken = std::exchange(recording(), {}).broken;
  MOE_CHECK(broken.empty(), "[guarded device] {} inside a capture", broken);
  return std::move(graph_);
}

bool capture_open() {
  return capturing();
}

void record_in_capture(std::function<void()> operation) {
  MOE_CHECK(capturing(), "[guarded device] no capture is open to record into");
  recording().operations->push_back(std::move(operation));
}

std::vector<size_t> take_host_to_device_copies() {
  return guarded_memory().take_host_to_device();
}

Scope::Scope() : previous_default_(default_device()) {
  register_device_memory(Device::kCuda, &guarded_memory());
  register_device_graphs(Device::kCuda, &guarded_graphs());
  kernels::register_device_backend(Device::kCuda, &guarded_backend());
  previous_clock_ = phase_timer::device_clock();
  phase_timer::set_device_clock(&guarded_phase_clock());
  set_default_device(Device::kCuda);
}

Scope::~Scope() {
  set_default_device(previous_default_);
  phase_timer::set_device_clock(previous_clock_);
  kernels::register_device_backend(Device::kCuda, nullptr);
  register_device_graphs(Device::kCuda, nullptr);
  register_device_memory(Device::kCuda, nullptr);
}

}  // namespace moecore::guarded_device
