#include "train/training_data.h"

namespace moecore {

data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor, int64_t dp_ranks) {
  return data::DataLoader(
      dataset,
      data::InstanceOrder::with_rule(config.data.order, config.train.seed, dataset.num_instances(),
                                     config.train.batch_size),
      cursor, dp_ranks);
}

}  // namespace moecore
