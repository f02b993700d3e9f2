// `moecore`: the command-line entry point. Every failure ends in one line on stderr naming the
// problem and a non-zero exit code.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "cli/debug_commands.h"
#include "core/check.h"
#include "train/run_config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"moecore: train Mixture-of-Experts language models"};
  app.require_subcommand(1);

  std::string config_path, out_path;
  std::string seed_text = "0";
  CLI::App* init = app.add_subcommand("init", "write initialised weights (safetensors, HF names)");
  init->add_option("--config", config_path, "config TOML")->required();
  init->add_option("--seed", seed_text, "initialisation seed (0 .. 2^64-1)");
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
  debug_steps->add_option("--steps", debug.steps, "optimizer steps")->required();

  std::string train_config;
  std::vector<std::string> overrides;
  CLI::App* train = app.add_subcommand("train", "train a model from a config");
  train->add_option("config", train_config, "config TOML")->required();
  train->add_option("--set", overrides, "override, e.g. --set train.max_steps=50");

  // Every command-line error is one line on stderr; help and version output stay CLI11's.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
    if (!known) {
      fmt::print(stderr,
                 "moecore: error: unknown command '{}' (expected init, debug-state, "
                 "debug-steps, train)\n",
                 argv[1]);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "moecore: error: {}\n", e.what());
    return e.get_exit_code() != 0 ? e.get_exit_code() : 2;
  }

  try {
    if (init->parsed()) {
      moecore::cli::run_init(config_path, moecore::cli::parse_seed(seed_text), out_path);
    } else if (debug_state->parsed()) {
      moecore::cli::run_debug_state(debug);
    } else if (debug_steps->parsed()) {
      moecore::cli::run_debug_steps(debug);
    } else if (train->parsed()) {
      moecore::train(moecore::load_run_config(train_config, overrides));
    }
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr,
               "moecore: error: out of memory (the configured model or batch is too large "
               "for this machine)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "moecore: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
