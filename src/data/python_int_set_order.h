// The order CPython iterates a set of non-negative integers in: olmo_eval's fast multiple choice
// visits its documents as `{sample["doc_id"] for sample in samples}` iterates (tasks.py), so the
// order its metric sums documents in, and lists its samples in, is this one. For ids 0..n-1 added
// in any order it is ascending; for sparse ids it is the hash table's slot order.
//
// CPython's setobject.c (unchanged from 3.7 to 3.13): an int hashes to itself modulo 2^61 - 1; a
// table of 8 slots to start; a key goes to slot hash & mask, else to the first free one of the
// next LINEAR_PROBES (9) slots when they fit in the table, else the probe moves on by
// i = (i * 5 + 1 + perturb) & mask with perturb = hash shifted right by 5 more each time; when
// the filled slots reach 3/5 of the mask the table grows to the smallest power of two above 4x the
// keys (2x beyond 50000 keys), the old slots reinserted in slot order.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore::data {

// The distinct values of `values` (non-negative; added in the order given) in the order
// `list({v for v in values})` gives them.
std::vector<int64_t> python_int_set_order(const std::vector<int64_t>& values);

}  // namespace moecore::data
