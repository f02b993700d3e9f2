#include "cli/dump_command.h"

#include <omp.h>

#include <algorithm>
#include <optional>
#include <span>

#include "cli/debug_commands.h"
#include "cli/devices_command.h"
#include "core/check.h"
#include "core/device_memory.h"
#include "core/fnv1a.h"
#include "core/ignore_index.h"
#include "core/mx_types.h"
#include "data/token_dataset.h"
#include "dist/mpi/mpi_runtime.h"
#include "io/model_weights.h"
#include "kernels/matmul_precision.h"
#include "model/router.h"
#include "model/transformer.h"
#include "train/evaluate.h"
#include "train/run_config.h"
#include "train/training_data.h"

namespace moecore::cli {

namespace {

// FNV-1a: an identity of inputs (config, weights, batch) in the manifest, so that diff can tell
// whether two dumps ran the same batch.
template <typename T>
std::string hash_hex(const std::vector<T>& values) {
  return fmt::format("{:016x}", fnv1a(std::as_bytes(std::span(values))));
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int64_t rows = 0, seq = 0;
  int32_t document_eos = -1;
  std::string source;
  int64_t masked_rows = 0;  // rows data.instance_filter masked (their targets ignored)
};

Batch load_batch(const DumpArgs& args, const RunConfig& config) {
  Batch batch;
  MOE_CHECK(args.tokens.empty() == args.targets.empty(),
            "[dump] --tokens and --targets go together (neither: the first batch of data.train)");
  if (!args.tokens.empty()) {
    MOE_CHECK(args.batch_size == 0, "[dump] --batch-size applies to data.train, not to --tokens");
    IdArray tokens = read_ids(args.tokens), targets = read_ids(args.targets);
    MOE_CHECK(tokens.batch == targets.batch && tokens.seq == targets.seq,
              "[dump] tokens {} are [{}, {}] but targets {} are [{}, {}]", args.tokens,
              tokens.batch, tokens.seq, args.targets, targets.batch, targets.seq);
    batch = {std::move(tokens.values),
             std::move(targets.values),
             tokens.batch,
             tokens.seq,
             -1,
             args.tokens};
    if (config.data.document_masking) {
      MOE_CHECK(config.data.eos_id >= 0,
                "[dump] data.document_masking with --tokens needs data.eos_id in the config");
      batch.document_eos = static_cast<int32_t>(config.data.eos_id);
    }
    return batch;
  }
  const TrainConfig& t = config.train;
  MOE_CHECK(!config.data.train.empty(),
            "[dump] the config has no data.train; pass --tokens and --targets");
  const data::TokenDataset dataset = open_training_set(config);
  batch.rows = args.batch_size > 0 ? args.batch_size : t.batch_size / t.microbatches;
  batch.seq = t.seq_len;
  data::DataLoader loader = training_loader(config, dataset);
  loader.next_batch(batch.rows, batch.tokens, batch.targets);
  const std::span<const uint8_t> masked = loader.masked_rows();
  batch.masked_rows = std::count(masked.begin(), masked.end(), uint8_t{1});
  batch.document_eos = document_masking_eos(config.data, dataset);
  batch.source =
      fmt::format("data.train, first {} instances (train.seed {}{})", batch.rows, t.seed,
                  config.data.order == data::OrderRule::kOlmoCore ? ", OLMo-core's order" : "");
  return batch;
}

}  // namespace

RunConfig dump_config(const DumpArgs& args, const std::vector<std::string>& extra_overrides) {
  std::vector<std::string> overrides = args.overrides;
  overrides.insert(overrides.end(), extra_overrides.begin(), extra_overrides.end());
  return load_run_config(args.config, overrides);
}

io::TensorDump record_dump(const DumpArgs& args, const RunConfig& config) {
  // Every rank would write the same directory: the pass is one process's, without a layout.
  MOE_CHECK(
      dist::mpi_world()->size() == 1,
      "[dump] runs in one process; start it without mpirun (the dump has no parallel layout)");
  // train.threads, or 0: the process's OpenMP default, taken before any pass set another (diff
  // runs two passes in one process: A's count must not carry into B's).
  static const int default_threads = omp_get_max_threads();
  omp_set_num_threads(config.train.threads > 0 ? static_cast<int>(config.train.threads)
                                               : default_threads);
  // train.device: the pass runs there (diff --b-set train.device=cuda compares it with the CPU's);
  // what the dump keeps is copied to the host.
  const std::string device_description = select_device(config.train);
  const DefaultDeviceScope on_device(config.train.device);
  const ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  if (args.weights.empty())
    init_params(layout, config.model, config.train.init, config.train.weights_seed(), params);
  else
    io::load_weights(layout, args.weights, params);
  const Batch batch = load_batch(args, config);

  const std::string config_toml = run_config_to_toml(config);
  std::vector<float> dense_copy, expert_copy;
  const uint64_t weights_hash =
      fnv1a(std::as_bytes(host_readable(params.expert, expert_copy)),
            fnv1a(std::as_bytes(host_readable(params.dense, dense_copy))));
  io::TensorDump dump;
  dump.run["precision"] = train_precision_name(config.train.precision);
  // The variant of the MX recipe, which diff's header and threshold rule name (tensor_diff.h).
  if (config.train.precision == TrainPrecision::kMxfp8)
    dump.run["mxfp8"] = {{"scale", std::string(mx::scale_mode_name(config.train.mxfp8.scale_mode))},
                         {"dense", config.train.mxfp8.dense},
                         {"expert_wgrad", config.train.mxfp8.expert_wgrad}};
  dump.run["backend"] = std::string(device_name(config.train.device));
  if (!device_description.empty()) dump.run["device"] = device_description;
  dump.run["threads"] = omp_get_max_threads();
  dump.run["config"] = config_toml;
  dump.run["config_fnv1a"] = fmt::format("{:016x}", fnv1a(std::as_bytes(std::span(config_toml))));
  dump.run["weights"] = args.weights.empty()
                            ? fmt::format("init, seed {}", config.train.weights_seed())
                            : args.weights;
  dump.run["weights_fnv1a"] = fmt::format("{:016x}", weights_hash);
  dump.run["batch"] = batch.source;
  dump.run["batch_shape"] = std::vector<int64_t>{batch.rows, batch.seq};
  dump.run["tokens_fnv1a"] = hash_hex(batch.tokens);
  dump.run["targets_fnv1a"] = hash_hex(batch.targets);

  const char* phase = "forward";
  auto record = [&](const std::string& name, ConstTensorView tensor) {
    io::DumpedTensor t{name, phase, tensor.dtype() == DType::kI32, {}, {}};
    for (int d = 0; d < tensor.rank(); ++d) t.shape.push_back(tensor.size(d));
    t.values.resize(static_cast<size_t>(tensor.numel()));
    // The transformer hands observers host tensors (a device's are copied first: emit()).
    if (t.index) {
      const int32_t* ids = tensor.data<int32_t>("dump");
      for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<float>(ids[i]);
    } else {
      const float* values = tensor.data<float>("dump");
      std::copy_n(values, t.values.size(), t.values.begin());
    }
    dump.tensors.push_back(std::move(t));
  };

  ParamBuffers grads(layout);
  auto record_param_grads = [&](auto&& wanted) {
    for (const ParamSpec& spec : layout.specs())
      if (!spec.is_buffer && wanted(spec.name)) {
        std::vector<float> values(spec.numel);
        copy_bytes(values.data(), grads.at(spec), spec.numel * sizeof(float));
        dump.tensors.push_back({"grad." + spec.name, phase, false, spec.shape, std::move(values)});
      }
  };
  auto in_layers = [](const std::string& name) { return name.starts_with("model.layers."); };

  Transformer model(config.model, layout);
  model.set_precision(PrecisionRecipe::from_train(config.train.precision, config.train.mxfp8));
  model.set_lm_head_chunk_tokens(config.train.lm_head_chunk_tokens);
  model.set_z_loss_multiplier(config.train.z_loss_multiplier);
  model.set_recompute(config.train.recompute);
  model.set_document_masking(batch.document_eos, document_masking_bos(config.data));
  model.set_routing_seed(routing_forward_seed(config.train.seed, 0, 0));  // the first step's
  model.set_tensor_observer(record);
  // As the trainer divides: a masked instance's labels count as zero-loss tokens (OLMo-core's).
  if (batch.masked_rows > 0) {
    dump.run["masked_instances"] = batch.masked_rows;
    const int64_t counted = std::count_if(batch.targets.begin(), batch.targets.end(),
                                          [](int32_t t) { return t != kIgnoreIndex; });
    model.set_next_batch_counts(
        {counted,
         batch.rows * batch.seq,
         {},
         static_cast<double>(counted + batch.masked_rows * (batch.seq - 1))});
  }
  // Parameter gradients as the backward finishes them: the head's before the last layer's, each
  // layer's when it is done, the embedding's (the head's too when tied) at the end.
  bool head_recorded = false;
  model.set_layer_grads_ready([&](int64_t layer) {
    if (!head_recorded) {
      record_param_grads([&](const std::string& name) {
        return !in_layers(name) && name != "model.embed_tokens.weight";
      });
      head_recorded = true;
    }
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    record_param_grads([&](const std::string& name) { return name.starts_with(prefix); });
  });
  const LossParts loss =
      model.forward(params, batch.tokens.data(), batch.targets.data(), batch.rows, batch.seq);
  for (const auto& [name, value] :
       {std::pair{"loss.ce", loss.ce}, std::pair{"loss.lb", loss.lb}, std::pair{"loss.z", loss.z},
        std::pair{"loss.lm_z", loss.lm_z}, std::pair{"loss.total", loss.total}})
    dump.tensors.push_back({name, phase, false, {}, {static_cast<float>(value)}});
  phase = "backward";
  model.backward(params, grads, 1.0f);
  record_param_grads([&](const std::string& name) {
    return !in_layers(name) && (!head_recorded || name == "model.embed_tokens.weight");
  });
  return dump;
}

void run_dump(const DumpArgs& args, const std::string& out) {
  io::check_new_dump_dir(out);  // before the pass, which may take minutes
  io::write_tensor_dump(record_dump(args, dump_config(args, {})), out);
}

}  // namespace moecore::cli
