#include "optim/state_piece.h"

#include <fmt/format.h>

namespace moecore {

std::string state_piece_name(const std::string& moment, const StatePiece& piece) {
  if (piece.whole()) return moment + "." + piece.spec->name;
  return fmt::format("{}.{}[{}:{}]", moment, piece.spec->name, piece.offset,
                     piece.offset + piece.count);
}

}  // namespace moecore
