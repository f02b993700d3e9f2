#include "model/moe_dispatch.h"

namespace moecore {

std::vector<int64_t> order_routes_by_expert(const RouterState& router, int64_t experts,
                                            int64_t routes, std::vector<int32_t>& send_pos) {
  std::vector<int64_t> cursor(static_cast<size_t>(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e)
    cursor[static_cast<size_t>(e + 1)] =
        cursor[static_cast<size_t>(e)] + router.expert_counts[static_cast<size_t>(e)];
  send_pos.resize(static_cast<size_t>(routes));
  for (size_t r = 0; r < static_cast<size_t>(routes); ++r)
    send_pos[r] = static_cast<int32_t>(cursor[static_cast<size_t>(router.topk_index[r])]++);
  return cursor;
}

}  // namespace moecore
