// Traffic this process handed to its communication backend since the last reset, per
// "group.op": the payload an all-reduce reduces, a reduce-scatter's whole send buffer, an
// all-gather's own part, the rows an all-to-all(v) sends to other ranks, a put's or get's rows to
// or from another rank, a send's buffer. Groups of one rank count nothing (nothing moves). Float
// payloads keep the plain op name (allreduce, reduce_scatter, allgather, alltoallv, put, get,
// send); other element types and reductions carry a suffix (allreduce_f64, allreduce_i64,
// allreduce_max_f64, allgather_i64, alltoall_i64, ...). `moecore plan` predicts the float ones
// (src/plan/comm_model.h) and out_dir/rank_stats reports them. Only the main thread communicates,
// so no lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace moecore::dist {

struct TrafficCount {
  int64_t bytes = 0;
  int64_t calls = 0;
};

const std::map<std::string, TrafficCount>& traffic_counters();
void reset_traffic_counters();
void count_traffic(const std::string& group, const std::string& op, int64_t bytes);

// What the counters gained since `before` (an earlier copy of traffic_counters()), and that much
// added again: a step graph's replay moves what its capture issued, which counted it once.
std::map<std::string, TrafficCount> traffic_since(
    const std::map<std::string, TrafficCount>& before);
void add_traffic(const std::map<std::string, TrafficCount>& counts);

}  // namespace moecore::dist
