// The decoder-only MoE transformer: embedding -> N x [RMSNorm -> attention -> residual -> RMSNorm
// -> FFN (MoE or dense SwiGLU) -> residual] -> RMSNorm -> LM head, with the losses of DESIGN.md.
// forward() saves every activation the backward needs, or with activation recompute
// (model/activation_recompute.h) only part of them and rebuilds the rest block by block in
// backward(); backward() adds parameter gradients.
//
// A Transformer may run a contiguous range of layers only (a pipeline model chunk): the embedding
// belongs to the chunk that starts at layer 0, the final norm, LM head and cross-entropy to the
// one that ends at the last layer, and hidden states cross chunk boundaries. A chunk keeps the
// activations of several micro-batches in flight, one slot each.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/device_memory.h"
#include "core/dtype.h"
#include "core/workspace.h"
#include "model/activation_recompute.h"
#include "model/attention.h"
#include "model/bf16_weight_copies.h"
#include "model/config.h"
#include "model/moe_block.h"
#include "model/mx_weight_caches.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/rope.h"
#include "model/tensor_observer.h"

namespace moecore {

// Loss parts as DESIGN.md defines them (kernels/loss_parts.h). lb and z are unscaled (sum over MoE
// layers; the HF-style lb is one value over all layers); lm_z is the LM head's z-loss, the mean
// over counted targets of logsumexp(logits)^2, unscaled; total = ce + router_aux_loss_coef * lb +
// router_z_loss_coef * z + z_loss_multiplier * lm_z. Over a pipeline chunk, lb and z are its
// layers' share, ce and lm_z are 0 except on the chunk with the head, and total is the same sum of
// those shares: the parts of all chunks add up to the whole model's.
struct LossParts {
  double ce = 0.0;
  double lb = 0.0;
  double z = 0.0;
  double lm_z = 0.0;
  double total = 0.0;
  int64_t counted_tokens = 0;  // targets != -100
};

class Transformer {
 public:
  // With expert parallelism `layout` holds this rank's experts and `exchange` reaches the others;
  // with pipeline parallelism `layers` is this chunk's range and `layout` holds at least its
  // tensors.
  Transformer(const ModelConfig& config, const ParamLayout& layout,
              const ExpertExchange* exchange = nullptr, LayerRange layers = {});
  ~Transformer();
  // Sub-blocks hold references to members, so a Transformer stays where it was built.
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // tokens, targets: [batch, seq], ids in [0, vocab_size) (targets may also be -100). Throws a
  // moecore::Error naming the first out-of-range id. Pass targets = nullptr for logits only (the
  // parts are then 0). A forward_chunk() of slot 0 and read_losses(): it waits for the device.
  LossParts forward(const ParamBuffers& params, const int32_t* tokens, const int32_t* targets,
                    int64_t batch, int64_t seq);

  // grads += d(loss_scale * total)/d params, for the batch of the last forward().
  void backward(const ParamBuffers& params, ParamBuffers& grads, float loss_scale);

  // Pipeline chunk passes over the activations of slot `slot` (one per micro-batch in flight).
  // Input: `tokens` on the chunk with the embedding, else `hidden_in` [batch * seq, d]; `targets`
  // on every chunk (nullptr for logits only): the chunk with the head computes the cross-entropy,
  // and every chunk counts them (loss_normalizer "labels" divides the router losses by their
  // global count; a chunk with MoE layers refuses to run without them then). Output: `hidden_out`
  // [batch * seq, d] on every chunk but the last. Every pass but the head's without targets
  // records its loss parts where the model's tensors are, for read_losses(): the passes never
  // wait for the device (issue 15 item 3: a GPU's step is queued without stopping). tokens and
  // targets may be in host memory (checked there) or already in the model's device memory (then
  // the kernels check the ids where they are, and the pass needs set_next_batch_counts(); not
  // with document masking, which finds the documents on the host): a pass with its inputs placed
  // beforehand copies nothing between host and device, as a CUDA graph's capture needs.
  void forward_chunk(int64_t slot, const ParamBuffers& params, const int32_t* tokens,
                     const float* hidden_in, const int32_t* targets, int64_t batch, int64_t seq,
                     float* hidden_out);
  // The loss parts of every forward pass recorded since the last read, in the order of the
  // passes, in one copy to the host (the one wait for a device), and forgets them.
  std::vector<LossParts> read_losses();
  // The same unread loss parts where they are: [passes, kernels::kLossParts] f64 rows, for a
  // decision on the device (kernels::step_decision); valid until the next forward or read.
  ConstTensorView recorded_losses() const;
  // A device graph (core/device_graph.h) replayed the training passes it captured on this chunk:
  // their losses are where the captured passes left theirs, and read_losses() reads them as
  // forward_chunk's would be, with `counted_targets` per pass (0 on a chunk without the head).
  void note_replayed_passes(std::span<const int64_t> counted_targets);
  // The forward passes this chunk has run (training and evaluation): a graph of a step is replayed
  // only while no other pass ran since its capture (train/step_graph.h), whose shapes and host
  // state it would not know.
  int64_t forward_passes() const { return forward_passes_; }
  // d_hidden_out: gradient of hidden_out (nullptr on the chunk with the head); d_hidden_in
  // receives the gradient of hidden_in (unused on the chunk with the embedding).
  void backward_chunk(int64_t slot, const ParamBuffers& params, ParamBuffers& grads,
                      float loss_scale, const float* d_hidden_out, float* d_hidden_in);
  bool has_embedding() const { return layers_begin_ == 0; }
  bool has_head() const { return layers_end_ == config_.num_hidden_layers; }
  LayerRange layers() const { return {layers_begin_, layers_end_}; }

  // Sums batch statistics (target and token counts, router statistics, loss sums) over the
  // data-parallel group in place, so that losses and gradients are those of the global batch:
  // `count` values of `type` (f64 or i64) in host memory or in the model's device memory.
  // Unset: this process holds the whole batch.
  using BatchSum = std::function<void(void* values, int64_t count, DType type)>;
  void set_batch_sum(BatchSum batch_sum) { batch_sum_ = std::move(batch_sum); }
  const BatchSum& batch_sum() const { return batch_sum_; }
  // The global micro-batch's counted targets (!= -100) and tokens, for the next forward pass only,
  // from a caller that holds the whole global batch (the trainer): that pass then sums neither
  // over the group (one blocking collective less per pass; on a device communicator, one host
  // operand less to stage). Unset: the pass counts its own targets and sums them with batch_sum.
  // divisor_on_device: the divisor (f64 [1]; `divisor`, else the count of targets) in the model's
  // device memory, which the cross-entropy then divides by there, for a pass that a CUDA graph
  // replays with other batches (the caller writes each batch's there before the replay, and keeps
  // it until the pass's backward); not with loss_normalizer = "labels" and MoE layers, whose
  // router losses divide by the host's. Empty: the host's, copied in.
  // divisor: what the cross-entropy (and under loss_normalizer = "labels" the router losses)
  // divide by, where it is not the micro-batch's own count (0): the trainer's share of the global
  // batch's count, as OLMo-core divides every micro-batch by the batch's labels.
  struct BatchCounts {
    int64_t counted_targets = 0, tokens = 0;
    ConstTensorView divisor_on_device = {};
    double divisor = 0.0;
  };
  void set_next_batch_counts(BatchCounts counts) { next_batch_counts_ = counts; }
  // With document masking, where each token's document starts ([batch, seq], in the model's
  // device memory, model/document_mask.h), for the next forward pass only: a pass whose tokens
  // are in device memory (a step graph's) cannot find them itself.
  void set_next_document_starts(const int32_t* starts) { next_document_starts_ = starts; }
  // For the next forward without targets only: the head computes no logits (the whole head's
  // [batch * seq, vocab] tensor, the largest of an evaluation pass); logits_at() then computes the
  // rows a caller reads. For a pass that reads few of its rows: the downstream evaluation reads a
  // continuation's rows of each query.
  void set_next_logits_on_demand() { next_logits_on_demand_ = true; }
  // Called during backward() as soon as layer i's parameter gradients are final (layers finish from
  // last to first), so their reduction can start while earlier layers still compute.
  using LayerGradsReady = std::function<void(int64_t layer)>;
  void set_layer_grads_ready(LayerGradsReady ready) { layer_grads_ready_ = std::move(ready); }
  // Every activation and activation gradient of the following passes, as they are computed
  // (model/tensor_observer.h); unset: none.
  void set_tensor_observer(TensorObserver observer) { observer_ = std::move(observer); }
  // train.recompute: which sublayers' activations the forward drops and the backward rebuilds.
  // The recomputed forward of a MoE layer re-does its expert-parallel exchange, in the backward's
  // layer order, which every rank of the ep group follows (all use the same mode).
  void set_recompute(ActivationRecompute mode) { recompute_ = mode; }
  ActivationRecompute recompute() const { return recompute_; }
  // train.lm_head_chunk_tokens: 0 (the default) keeps the micro-batch's logits from a forward with
  // targets to its backward, which makes their gradient; > 0 runs the head and its cross-entropy
  // in chunks of that many tokens and keeps no logits (model/chunked_lm_head.h): logits() is then
  // not available after such a forward; an observer still sees "lm_head" and "grad.lm_head",
  // assembled on the host from the chunks (a debugging tool's memory, not the training's).
  void set_lm_head_chunk_tokens(int64_t tokens);
  int64_t lm_head_chunk_tokens() const { return lm_head_chunk_tokens_; }
  // train.z_loss_multiplier: the LM head's z-loss weight in the total and its gradient, OLMo-core's
  // train-module z_loss_multiplier (>= 0; 0, the default: lm_z is still reported, untrained).
  void set_z_loss_multiplier(double multiplier);
  double z_loss_multiplier() const { return z_loss_multiplier_; }
  // The operand precision of each module kind's GEMMs (train.precision's recipe; default: fp32
  // everywhere). Modules in bf16 read bf16 copies of their weights (model/bf16_weight_copies.h),
  // MXFP8 GEMMs MX caches of them (model/mx_weight_caches.h); both are "weight copies" below.
  void set_precision(const PrecisionRecipe& precision);
  // When the bf16 weight copies are remade from the fp32 weights. kEveryForward (the default): at
  // every forward()/forward_chunk(), so any caller that changes the weights between passes stays
  // correct. kOnWeightsChanged: at the first forward after weights_changed() (or with another
  // ParamBuffers object), which the owner of the weights calls after every change of them, e.g.
  // the trainer after each optimizer step and load: the copies are then made once per step.
  enum class WeightCopyRefresh : uint8_t { kEveryForward, kOnWeightsChanged };
  void set_weight_copy_refresh(WeightCopyRefresh refresh) { copy_refresh_ = refresh; }
  void weights_changed() { copies_source_ = nullptr; }
  const Bf16WeightCopies& bf16_weight_copies() const { return bf16_copies_; }
  const MxWeightCaches& mx_weight_caches() const { return mx_caches_; }
  // The passes' temporaries (core/workspace.h). Between a step's passes it is idle, and the
  // trainer lends it to the optimizer's gradient reduction.
  Workspace& workspace() { return workspace_; }

  // Routing modes (model.routing, see router.h): the seed of the next forward() (random routing
  // derives one stream per layer and token from it; routing_forward_seed makes one per training
  // step and micro-batch), and the global index of this process's first token in the micro-batch
  // (with data parallelism, the position of this rank's slice), so that the random draws and the
  // balanced spread are those of the global batch whatever the layout.
  void set_routing_seed(uint64_t seed) { routing_seed_ = seed; }
  // Intra-document attention masking (data.document_masking, model/document_mask.h): documents
  // end at each `eos_id`; negative: off (plain causal attention). forward_chunk() then needs the
  // tokens on every chunk, not only the one with the embedding.
  // bos_id >= 0: documents end only at an EOS followed by a BOS (model/document_mask.h).
  void set_document_masking(int32_t eos_id, int32_t bos_id = -1) {
    document_eos_ = eos_id;
    document_bos_ = bos_id;
  }
  int32_t document_masking_eos() const { return document_eos_; }
  int32_t document_masking_bos() const { return document_bos_; }
  void set_routing_token_offset(int64_t offset) { routing_token_offset_ = offset; }

  // Auxiliary-loss-free balancing (model.router_bias_update_rate > 0). Every forward with targets
  // adds its global micro-batch's routes per expert to a per-layer tally (summed over the
  // data-parallel group with the other batch statistics, so every rank holds the same tally);
  // update_router_bias, called after the optimizer step, moves each MoE layer's selection bias by
  // rate * sign(mean count - count_e) and clears the tally. Clear it before a step's first forward
  // (an evaluation in between also counts).
  void clear_selection_counts();
  // step_factors: the step's decision where it was made (kernels::step_decision; a skipped step
  // moves no bias), or an empty view.
  void update_router_bias(ParamBuffers& params, ConstTensorView step_factors = {});

  // Of the last forward (any slot): [batch * seq, vocab], on the chunk with the head, after a
  // forward without targets or one with the whole head (lm_head_chunk_tokens 0).
  const DeviceArray<float>& logits() const;
  // After a forward of the head, its logits at `count` rows of that pass's batch * seq tokens:
  // out[i, :] = the logits of row rows[i] ([count, vocab], host memory; rows in host memory), by
  // the whole head's operations (the final norm's output of those rows times the head, in the
  // head's precision) on the gathered rows, in one GEMM. Its temporaries (count x (hidden + vocab)
  // floats) live in the workspace for the call.
  void logits_at(const ParamBuffers& params, const int32_t* rows, int64_t count, float* out);
  const ModelConfig& config() const { return config_; }
  // Router state of each layer of the last forward (nullptr for dense layers and for layers
  // outside this chunk).
  const RouterState* router_state(int64_t layer) const;
  // Routes of layer `layer` that this rank's capacity limit dropped in the last forward (the
  // rowwise dispatch; 0 for the dropless dispatches, dense layers and layers outside this chunk).
  int64_t dropped_routes(int64_t layer) const;

 private:
  struct LayerCache;
  struct Activations;

  // A block's two sublayers, as the forward runs them and the backward re-runs them.
  // Attention: x -> lc.mid (pre-norm: mid = x + attn(norm1(x)); reordered: x + norm1(attn(x))).
  void attention_sublayer_forward(const ParamBuffers& params, int64_t layer, const float* x,
                                  const Activations& act, LayerCache& lc, float* branch) const;
  // Feed-forward: lc.mid -> out = mid + ffn(norm2(mid)) (reordered: mid + norm2(ffn(mid)));
  // out == nullptr: only the cache is rebuilt. The MoE dispatch's temporaries come from the
  // workspace.
  void ffn_sublayer_forward(const ParamBuffers& params, int64_t layer, int64_t tokens,
                            LayerCache& lc, float* branch, float* out);
  // Takes from a layer what recompute_ rebuilds in the backward (after the forward, and again
  // after the block's backward, so that one block's rebuilt activations are alive at a time) and
  // keeps the memory in recycled_; reuse_recomputed hands it to the next layer that rebuilds them,
  // so that recompute asks the heap for nothing after the first step.
  void release_recomputed(LayerCache& lc);
  void reuse_recomputed(LayerCache& lc);

  // The weights each module's GEMMs read (bf16 copies where the recipe says bf16) and the
  // gradients they add to.
  AttentionWeights attention_weights(const ParamBuffers& params, int64_t layer) const;
  AttentionGrads attention_grads(ParamBuffers& grads, int64_t layer) const;
  MoeWeights moe_weights(const ParamBuffers& params, int64_t layer) const;
  MoeGrads moe_grads(ParamBuffers& grads, int64_t layer) const;
  // A GEMM's weight operand of `shape`, starting at `spec` (nullptr: an empty view): its bf16 copy
  // when it has one, else the fp32 values.
  ConstTensorView gemm_weight(const ParamBuffers& params, const ParamSpec* spec,
                              std::initializer_list<int64_t> shape) const;
  // A linear layer's weight: gemm_weight and, where the recipe runs it in MXFP8, its MX caches.
  LinearWeight linear_weight(const ParamBuffers& params, const ParamSpec* spec,
                             std::initializer_list<int64_t> shape) const;
  // The MXFP8 caches of the weight starting at `spec`, or nullptr (not MXFP8 under the recipe).
  const MxWeight* mx_weight(const ParamSpec* spec) const;
  void refresh_weight_copies(const ParamBuffers& params);
  // The observer hooks: `name` is a full name, `module` one inside model.layers.{layer} (empty:
  // the layer itself), "grad." prefixed for a gradient; nothing is formatted without an observer.
  void observe(const std::string& name, ConstTensorView tensor) const;
  // Passes a tensor to the observer, through a host copy when it is a device's.
  void emit(const std::string& name, ConstTensorView tensor) const;
  void observe_layer(int64_t layer, std::string_view module, ConstTensorView tensor,
                     bool gradient = false) const;
  void observe_attention(int64_t layer, const AttentionCache& cache, const float* out) const;
  void observe_ffn(int64_t layer, const LayerCache& cache, int64_t tokens, const float* out) const;

  ModelConfig config_;
  const ParamLayout& layout_;
  std::vector<LayerSpecs> layer_specs_;
  const ParamSpec* embed_ = nullptr;
  const ParamSpec* final_norm_ = nullptr;
  const ParamSpec* lm_head_ = nullptr;  // the embedding when tied
  RopeTable rope_;
  AttentionBlock attention_;
  MoeBlock moe_;

  int64_t layers_begin_ = 0, layers_end_ = 0;
  std::vector<std::unique_ptr<Activations>> slots_;
  std::unique_ptr<LayerCache> recycled_;  // the buffers of the activations recompute_ drops
  // The passes' temporaries (the branch output, the residual stream's gradient, the sublayers'
  // scratch), sized by the first step.
  Workspace workspace_;
  int64_t last_slot_ = -1;  // of the last forward
  BatchSum batch_sum_;
  std::optional<BatchCounts> next_batch_counts_;   // set_next_batch_counts(), for one pass
  const int32_t* next_document_starts_ = nullptr;  // set_next_document_starts(), for one pass
  bool next_logits_on_demand_ = false;             // set_next_logits_on_demand(), for one pass
  LayerGradsReady layer_grads_ready_;
  TensorObserver observer_;
  ActivationRecompute recompute_ = ActivationRecompute::kNone;
  int64_t lm_head_chunk_tokens_ = 0;  // 0: the whole head
  double z_loss_multiplier_ = 0.0;
  // The LM head's and dense MLPs' entries are read here; attention_ and moe_ hold the others.
  PrecisionRecipe precision_;
  Bf16WeightCopies bf16_copies_;
  MxWeightCaches mx_caches_;  // refreshed with bf16_copies_
  WeightCopyRefresh copy_refresh_ = WeightCopyRefresh::kEveryForward;
  const ParamBuffers* copies_source_ = nullptr;  // what the copies hold; nullptr: stale
  bool recomputing_ = false;  // the backward re-runs a forward: observed once already
  uint64_t routing_seed_ = 0;
  int64_t routing_token_offset_ = 0;
  std::vector<int64_t> moe_layers_;  // this chunk's MoE layers, first to last
  // [MoE layers][E] f64: the global micro-batches' routes per expert since the last clear, where
  // the model's tensors are (the selection-bias update reads nothing back from a device).
  DeviceArray<double> selection_tally_;
  // [passes][kernels::kLossParts] f64: the loss parts of the forward passes since the last
  // read_losses(), where the model's tensors are, and each pass's counted targets (known on the
  // host).
  DeviceArray<double> recorded_losses_;
  std::vector<int64_t> recorded_counted_;
  int64_t forward_passes_ = 0;
  int32_t document_eos_ = -1;
  int32_t document_bos_ = -1;
};

}  // namespace moecore
