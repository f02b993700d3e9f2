#include "cli/diff_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/devices_command.h"
#include "cli/tensor_diff.h"
#include "core/check.h"

namespace moecore::cli {

namespace {

struct Side {
  std::string label;  // the directory, or "CONFIG --a-set ..."
  io::TensorDump dump;
};

std::string run_field(const io::TensorDump& dump, const char* key) {
  const auto found = dump.run.find(key);
  if (found == dump.run.end()) return "";
  return found->is_string() ? found->get<std::string>() : found->dump();
}

// The manifest's identity without the effective config text (long; the hash stands for it).
nlohmann::json identity(const Side& side) {
  nlohmann::json run = side.dump.run;
  run.erase("config");
  return {{"source", side.label}, {"run", run}};
}

std::string describe(const Side& side) {
  return fmt::format("{} (precision {}, backend {}, threads {}, weights {}, batch {} {})",
                     side.label, describe_precision(run_precision(side.dump)),
                     run_field(side.dump, "backend"), run_field(side.dump, "threads"),
                     run_field(side.dump, "weights"), run_field(side.dump, "batch"),
                     run_field(side.dump, "batch_shape"));
}

std::string join_overrides(const std::vector<std::string>& overrides) {
  std::string text;
  for (const std::string& o : overrides) text += " --set " + o;
  return text;
}

std::string number(double value) {
  if (std::isinf(value)) return "inf";
  return value == 0.0 ? "0" : fmt::format("{:.3e}", value);
}

}  // namespace

int run_diff(const DiffArgs& args) {
  Side a, b;
  if (args.inputs.size() == 2) {
    MOE_CHECK(args.run.overrides.empty() && args.a_set.empty() && args.b_set.empty() &&
                  args.run.weights.empty() && args.run.tokens.empty() && args.run.targets.empty() &&
                  args.run.batch_size == 0,
              "[diff] --set, --a-set, --b-set, --weights, --tokens, --targets and --batch-size "
              "run a config (moecore diff CONFIG ...), not two dumps");
    a = {args.inputs[0], io::read_tensor_dump(args.inputs[0])};
    b = {args.inputs[1], io::read_tensor_dump(args.inputs[1])};
  } else {
    MOE_CHECK(args.inputs.size() == 1,
              "[diff] expected two dump directories or one config, got {} arguments",
              args.inputs.size());
    DumpArgs run = args.run;
    run.config = args.inputs[0];
    // Both sides' configs and devices are checked before either pass runs: a bad --b-set or a
    // GPU this program cannot use is one line at once, not after A's pass (and its data) ran.
    const RunConfig a_config = dump_config(run, args.a_set),
                    b_config = dump_config(run, args.b_set);
    for (const RunConfig* config : {&a_config, &b_config}) select_device(config->train);
    a = {run.config + join_overrides(args.a_set), record_dump(run, a_config)};
    b = {run.config + join_overrides(args.b_set), record_dump(run, b_config)};
  }
  for (const Side* side : {&a, &b}) {
    MOE_CHECK(!side->dump.tensors.empty(), "[diff] {} holds no tensors: nothing to compare",
              side->label);
    for (const char* key : {"tokens_fnv1a", "targets_fnv1a", "batch_shape"})
      MOE_CHECK(!run_field(side->dump, key).empty(),
                "[diff] {}'s manifest does not say its batch ({} missing): moecore dump writes it",
                side->label, key);
  }
  for (const char* key : {"batch_shape", "tokens_fnv1a", "targets_fnv1a"})
    MOE_CHECK(run_field(a.dump, key) == run_field(b.dump, key),
              "[diff] A and B ran different batches ({} {} vs {}): compare runs of one batch", key,
              run_field(a.dump, key), run_field(b.dump, key));

  std::string rule;
  const double threshold =
      args.threshold ? *args.threshold
                     : default_threshold(run_precision(a.dump), run_precision(b.dump), rule);
  if (args.threshold) rule = fmt::format("--threshold {:.3g}", threshold);
  const std::vector<TensorDifference> diffs = compare_dumps(a.dump, b.dump, threshold);
  const auto first =
      std::find_if(diffs.begin(), diffs.end(), [](const TensorDifference& d) { return d.parted; });
  const bool same_weights =
      run_field(a.dump, "weights_fnv1a") == run_field(b.dump, "weights_fnv1a");
  constexpr const char* kNorm =
      "||a - b||_2 / ||a||_2 over the whole tensor, A the reference; ids: fraction that differ";

  if (args.json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (size_t i = 0; i < diffs.size(); ++i) {
      const TensorDifference& d = diffs[i];
      // JSON has no infinity: null stands for it.
      tensors.push_back(
          {{"index", i},
           {"name", d.name},
           {"phase", d.phase},
           {"kind", d.index ? "index" : "value"},
           {"shape", d.shape},
           {"normalised_error",
            std::isinf(d.normalised_error) ? nlohmann::json() : nlohmann::json(d.normalised_error)},
           {"max_abs_diff",
            std::isinf(d.max_abs_diff) ? nlohmann::json() : nlohmann::json(d.max_abs_diff)},
           {"mismatches", d.mismatches},
           {"parted", d.parted}});
    }
    nlohmann::json report = {{"a", identity(a)},
                             {"b", identity(b)},
                             {"same_weights", same_weights},
                             {"norm", kNorm},
                             {"threshold", threshold},
                             {"threshold_rule", rule},
                             {"tensors", tensors},
                             {"parted", first != diffs.end()},
                             {"first_parted", nullptr}};
    if (first != diffs.end())
      report["first_parted"] = tensors[static_cast<size_t>(first - diffs.begin())];
    fmt::print("{}\n", report.dump(1));
    return first != diffs.end() ? kDiffExitParted : 0;
  }

  fmt::print("A: {}\nB: {}\n", describe(a), describe(b));
  if (!same_weights) fmt::print("weights: A and B hold different weights\n");
  fmt::print("normalised error: {}\nthreshold: {}\n", kNorm, rule);
  size_t name_width = 4, shape_width = 5;
  for (const TensorDifference& d : diffs) {
    name_width = std::max(name_width, d.name.size());
    shape_width = std::max(shape_width, fmt::format("{}", d.shape).size());
  }
  fmt::print("{:>4}  {:<8}  {:<{}}  {:<{}}  {:>10}  {:>10}  {:>10}\n", "#", "phase", "name",
             name_width, "shape", shape_width, "norm_err", "max_abs", "differ");
  for (size_t i = 0; i < diffs.size(); ++i) {
    const TensorDifference& d = diffs[i];
    const char* mark = !d.parted                                           ? ""
                       : (i == static_cast<size_t>(first - diffs.begin())) ? "  <- first parted"
                                                                           : "  *";
    fmt::print("{:>4}  {:<8}  {:<{}}  {:<{}}  {:>10}  {:>10}  {:>10}{}\n", i, d.phase, d.name,
               name_width, fmt::format("{}", d.shape), shape_width, number(d.normalised_error),
               d.index ? "-" : number(d.max_abs_diff), d.mismatches, mark);
  }
  if (first == diffs.end()) {
    const auto worst = std::max_element(diffs.begin(), diffs.end(),
                                        [](const TensorDifference& x, const TensorDifference& y) {
                                          return x.normalised_error < y.normalised_error;
                                        });
    fmt::print("equal within the threshold: {} tensors, largest normalised error {} ({})\n",
               diffs.size(), worst == diffs.end() ? "0" : number(worst->normalised_error),
               worst == diffs.end() ? "-" : worst->name);
    return 0;
  }
  fmt::print("parted at #{} ({}) {} {}: {}\n", first - diffs.begin(), first->phase, first->name,
             first->shape,
             first->index ? fmt::format("{} ids differ (a fraction {})", first->mismatches,
                                        number(first->normalised_error))
                          : fmt::format("normalised error {} > threshold {:.3g}",
                                        number(first->normalised_error), threshold));
  return kDiffExitParted;
}

}  // namespace moecore::cli
