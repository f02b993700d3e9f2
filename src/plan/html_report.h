// `moecore plan ... --html report.html` (issue 17, item 6): one self-contained page (no network:
// the data is embedded as JSON and drawn as inline SVG by an inline script) with the memory of a
// rank of each pipeline stage by component, the step time by category, and a sweep over ep at
// the same world size (tokens/s per rank and peak memory of each ep the layout allows). Every
// number drawn is also written as text into an element with a data-key attribute, so a headless
// browser can read the rendered page back (tests/train/test_plan_report.py).
#pragma once

#include <string>

#include "plan/plan.h"

namespace moecore::plan {

// The page's text.
std::string html_report(const Plan& plan);

}  // namespace moecore::plan
