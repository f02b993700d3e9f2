#include "cli/plan_command.h"

#include <fmt/format.h>

#include <filesystem>

#include "cli/distinct_paths.h"
#include "core/check.h"
#include "io/file_util.h"
#include "plan/html_report.h"
#include "plan/layout_search.h"
#include "plan/plan.h"
#include "train/run_config.h"

namespace moecore::cli {

namespace {

// train.lm_head_chunk_tokens as the search's table says it.
std::string head_chunk_label(int64_t tokens) {
  return tokens > 0 ? std::to_string(tokens) : "whole";
}

void print_search(const RunConfig& config, int64_t world, const plan::Hardware& hardware,
                  const PlanArgs& args) {
  const plan::LayoutSearch search =
      plan::search_layouts(config, world, hardware, args.max_memory_gb * 1e9);
  const std::vector<plan::LayoutChoice>& fits = search.fits;
  const plan::LayoutChoice& least = search.smallest;
  const size_t shown = std::min(fits.size(), static_cast<size_t>(args.top));
  if (args.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) {
      const plan::LayoutChoice& c = fits[i];
      rows.push_back({{"pp", c.pp},
                      {"dp", c.dp},
                      {"ep", c.ep},
                      {"ep_dp", c.ep_dp},
                      {"zero", c.zero},
                      {"microbatches", c.microbatches},
                      {"recompute", recompute_name(c.recompute)},
                      {"lm_head_chunk_tokens", c.lm_head_chunk_tokens},
                      {"peak_bytes", c.peak_bytes},
                      {"step_seconds", c.step_seconds},
                      {"tokens_per_s_per_rank", c.tokens_per_s_per_rank},
                      {"mfu", c.mfu}});
    }
    fmt::print("{}\n", nlohmann::json{{"world", world},
                                      {"hardware", hardware.name},
                                      {"max_memory_bytes", args.max_memory_gb * 1e9},
                                      {"layouts_considered", search.valid},
                                      {"layouts_that_fit", fits.size()},
                                      {"least_memory",
                                       {{"pp", least.pp},
                                        {"ep", least.ep},
                                        {"zero", least.zero},
                                        {"microbatches", least.microbatches},
                                        {"recompute", recompute_name(least.recompute)},
                                        {"lm_head_chunk_tokens", least.lm_head_chunk_tokens},
                                        {"peak_bytes", least.peak_bytes}}},
                                      {"layouts", rows}}
                           .dump());
    return;
  }
  fmt::print("{} of {} layouts of {} ranks fit {} GB per rank on {}", fits.size(), search.valid,
             world, args.max_memory_gb, hardware.name);
  if (fits.empty()) {
    fmt::print(
        "; the least memory any needs is {:.2f} GB per rank (pp {}, ep {}, zero {}, {} "
        "micro-batches, recompute {}, LM head chunk {}: `moecore plan` it for the breakdown)\n",
        least.peak_bytes / 1e9, least.pp, least.ep, least.zero, least.microbatches,
        recompute_name(least.recompute), head_chunk_label(least.lm_head_chunk_tokens));
    return;
  }
  fmt::print("; the fastest {}:\n", shown);
  fmt::print("{:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>10} {:>10} {:>10} {:>14} {:>6}\n", "pp",
             "dp", "ep", "ep_dp", "zero", "micro", "recompute", "head chunk", "peak GB", "step s",
             "tokens/s/rank", "MFU %");
  for (size_t i = 0; i < shown; ++i) {
    const plan::LayoutChoice& c = fits[i];
    fmt::print(
        "{:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>10} {:>10.2f} {:>10.4g} {:>14.5g} "
        "{:>6.1f}\n",
        c.pp, c.dp, c.ep, c.ep_dp, c.zero, c.microbatches, recompute_name(c.recompute),
        head_chunk_label(c.lm_head_chunk_tokens), c.peak_bytes / 1e9, c.step_seconds,
        c.tokens_per_s_per_rank, 100.0 * c.mfu);
  }
}

}  // namespace

void run_plan(const PlanArgs& args) {
  // --hardware names a built-in profile or a file.
  check_outputs_apart(
      {{"config", args.config},
       {"--hardware",
        std::filesystem::is_regular_file(args.hardware) ? args.hardware : std::string()}},
      {{"--html", args.html}});
  const RunConfig config = load_run_config(args.config, args.overrides);
  MOE_CHECK(args.ranks >= 0, "[plan] --ranks={} must be positive (0: pp x ep)", args.ranks);
  MOE_CHECK(args.max_memory_gb >= 0.0, "[plan] --max-memory={} must be positive",
            args.max_memory_gb);
  MOE_CHECK(args.top >= 1, "[plan] --top={} must be at least 1", args.top);
  const int64_t world = args.ranks > 0 ? args.ranks : config.parallel.pp * config.parallel.ep;
  const plan::Hardware hardware = plan::load_hardware(args.hardware);
  if (args.max_memory_gb > 0.0) {
    MOE_CHECK(args.html.empty(), "[plan] --html reports one layout: drop --max-memory");
    print_search(config, world, hardware, args);
    return;
  }
  const plan::Plan p = plan::make_plan(config, world, hardware);
  if (!args.html.empty()) {
    io::write_text_atomic(args.html, plan::html_report(p), "[plan] --html:");
  }
  if (args.json)
    fmt::print("{}\n", plan::plan_json(p).dump());
  else
    fmt::print("{}", plan::plan_text(p));
}

}  // namespace moecore::cli
