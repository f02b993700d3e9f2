// Text between the ranks of a group, for decisions every rank must make alike: a verdict one
// rank reached (a self-check, a damaged checkpoint, inputs that differ) travels to the others so
// that every rank stops with the same one-line message, whichever rank the job's abort hears first.
#pragma once

#include <string>

#include "dist/communicator.h"

namespace moecore::dist {

// Rank `root`'s `text` in every rank of `group`. Collective.
std::string broadcast_text(const Communicator& group, std::string text, int root);

// The lowest rank whose `report` is not empty, with that report and how many ranks reported;
// rank -1 (and no text) when none did. The same answer in every rank. Collective.
struct FirstReport {
  int rank = -1;
  std::string text;
  int reporting = 0;
};
FirstReport first_report(const Communicator& group, const std::string& report);

}  // namespace moecore::dist
