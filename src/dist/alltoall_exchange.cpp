#include "dist/alltoall_exchange.h"

namespace moecore::dist {

void AllToAllExchange::exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                                       int64_t per_rank) const {
  recv.resize(send.size());
  group_.alltoall(send.data(), recv.data(), per_rank);
}

void AllToAllExchange::exchange_rows(const float* send, const std::vector<int64_t>& send_rows,
                                     float* recv, const std::vector<int64_t>& recv_rows,
                                     int64_t width) const {
  const size_t ranks = send_rows.size();
  std::vector<int64_t> send_counts(ranks), send_displs(ranks), recv_counts(ranks),
      recv_displs(ranks);
  int64_t send_offset = 0, recv_offset = 0;
  for (size_t r = 0; r < ranks; ++r) {
    send_counts[r] = send_rows[r] * width;
    send_displs[r] = send_offset;
    send_offset += send_counts[r];
    recv_counts[r] = recv_rows[r] * width;
    recv_displs[r] = recv_offset;
    recv_offset += recv_counts[r];
  }
  group_.alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

}  // namespace moecore::dist
