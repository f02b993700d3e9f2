#include "data/python_int_set_order.h"

#include <cstddef>
#include <optional>

#include "core/check.h"

namespace moecore::data {

namespace {

constexpr size_t kLinearProbes = 9;
constexpr int kPerturbShift = 5;
constexpr size_t kMinSize = 8;

// Python's hash of a non-negative int: the value modulo the Mersenne prime 2^61 - 1.
uint64_t python_int_hash(int64_t value) {
  constexpr uint64_t kModulus = (uint64_t{1} << 61) - 1;
  return static_cast<uint64_t>(value) % kModulus;
}

struct Slot {
  std::optional<int64_t> key;
  uint64_t hash = 0;
};

// The slot a key goes to: set_add_entry's probe (and set_insert_clean's, the same sequence) over
// a table without deleted entries; stops at an equal key (already there) or a free slot.
size_t probe(const std::vector<Slot>& table, int64_t key, uint64_t hash) {
  const size_t mask = table.size() - 1;
  size_t i = static_cast<size_t>(hash) & mask;
  uint64_t perturb = hash;
  while (true) {
    const size_t probes = i + kLinearProbes <= mask ? kLinearProbes : 0;
    for (size_t j = 0; j <= probes; ++j) {
      const Slot& slot = table[i + j];
      if (!slot.key || *slot.key == key) return i + j;
    }
    perturb >>= kPerturbShift;
    i = static_cast<size_t>(i * 5 + 1 + perturb) & mask;
  }
}

}  // namespace

std::vector<int64_t> python_int_set_order(const std::vector<int64_t>& values) {
  std::vector<Slot> table(kMinSize);
  size_t used = 0;
  for (const int64_t value : values) {
    MOE_CHECK(value >= 0, "[python set] {} is negative", value);
    const uint64_t hash = python_int_hash(value);
    Slot& slot = table[probe(table, value, hash)];
    if (slot.key) continue;  // already in the set
    slot = {value, hash};
    ++used;
    const size_t mask = table.size() - 1;
    if (used * 5 < mask * 3)
      continue;  // fill * 5 < mask * 3: no resize (no deletions: fill = used)
    const size_t wanted = used > 50000 ? used * 2 : used * 4;
    size_t size = kMinSize;
    while (size <= wanted) size <<= 1;
    std::vector<Slot> grown(size);
    for (const Slot& old : table)
      if (old.key) grown[probe(grown, *old.key, old.hash)] = old;
    table = std::move(grown);
  }
  std::vector<int64_t> order;
  order.reserve(used);
  for (const Slot& slot : table)
    if (slot.key) order.push_back(*slot.key);
  return order;
}

}  // namespace moecore::data
