// dist::Window over MPI one-sided communication: MPI_Win_allocate, MPI_Put / MPI_Get inside
// MPI_Win_fence epochs.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "dist/communicator.h"

namespace moecore::dist {

class MpiWindow final : public Window {
 public:
  // Collective over comm (MPI_Win_allocate); group names the communicator in errors.
  MpiWindow(MPI_Comm comm, int rank, std::string group, int64_t count, std::string traffic_group);
  ~MpiWindow() override;  // collective (MPI_Win_free)
  MpiWindow(const MpiWindow&) = delete;
  MpiWindow& operator=(const MpiWindow&) = delete;

  float* data() const override { return data_; }
  int64_t size() const override { return count_; }
  void fence() const override;

 protected:
  void do_put(const float* src, int64_t count, int rank, int64_t offset) const override;
  void do_get(float* dst, int64_t count, int rank, int64_t offset) const override;

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  float* data_ = nullptr;
  int64_t count_ = 0;
  std::string group_;
};

}  // namespace moecore::dist
