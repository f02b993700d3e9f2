// How token rows reach the experts. With expert parallelism the experts of a MoE layer are split
// over the `ranks()` ranks of an ep group; every rank routes its own tokens, sends each routed row
// to the rank holding its expert, and gets the expert outputs back. The model code calls this
// interface; src/dist/ implements it over MPI. One rank: rows stay where they are.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int64_t ranks() const = 0;
  virtual int64_t rank() const = 0;
  // send[dst * per_rank + i] counts sent to rank dst; returns recv[src * per_rank + i] received.
  virtual void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                               int64_t per_rank) const = 0;
  // Rows of `width` floats. send holds rank 0's rows, then rank 1's, ... (send_rows[dst] each);
  // recv receives src 0's rows, then src 1's, ... (recv_rows[src] each).
  virtual void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                             const std::vector<int64_t>& recv_rows, int64_t width) const = 0;
};

// The single-rank case.
class LocalExchange final : public ExpertExchange {
 public:
  int64_t ranks() const override { return 1; }
  int64_t rank() const override { return 0; }
  void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                       int64_t) const override {
    recv = send;
  }
  void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                     const std::vector<int64_t>&, int64_t width) const override {
    const int64_t count = send_rows[0] * width;
    for (int64_t i = 0; i < count; ++i) recv[i] = send[i];
  }
};

}  // namespace moecore
