#include "dist/mpi/mpi_window.h"

#include <exception>
#include <limits>
#include <utility>

#include "core/check.h"
#include "dist/mpi/mpi_check.h"

namespace moecore::dist {

MpiWindow::MpiWindow(MPI_Comm comm, int rank, std::string group, int64_t count,
                     std::string traffic_group)
    : Window(rank, std::move(traffic_group)), count_(count), group_(std::move(group)) {
  MOE_CHECK(count >= 0 && count <= std::numeric_limits<MPI_Aint>::max() /
                                       static_cast<MPI_Aint>(sizeof(float)),
            "[mpi] window of {} floats on group '{}' is too large", count, group_);
  const MPI_Aint bytes = static_cast<MPI_Aint>(count) * static_cast<MPI_Aint>(sizeof(float));
  const int code =
      MPI_Win_allocate(bytes, static_cast<int>(sizeof(float)), MPI_INFO_NULL, comm, &data_, &win_);
  int error_class = MPI_SUCCESS;
  MPI_Error_class(code, &error_class);
  // Seen across hosts over TCP: Open MPI 4.1's osc/rdma needs an RDMA-capable transport, and
  // Debian's openmpi-mca-params.conf disables osc/pt2pt, the component that works over TCP.
  MOE_CHECK(error_class != MPI_ERR_WIN,
            "[mpi] MPI_Win_allocate on group '{}' failed: {} (no one-sided MPI component serves "
            "this transport; with Open MPI over TCP add `--mca osc pt2pt` to mpirun, or use "
            "parallel.dispatch=sync)",
            group_, mpi::error_text(code));
  mpi::check(code, "MPI_Win_allocate", group_);
  MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
}

MpiWindow::~MpiWindow() {
  // MPI_Win_free is collective: while an error unwinds this rank the others may never get there,
  // and the job is about to be ended (abort_job), so the window is left to MPI_Abort.
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
}

void MpiWindow::fence() const {
  mpi::check(MPI_Win_fence(0, win_), "MPI_Win_fence", group_);
}

void MpiWindow::do_put(const float* src, int64_t count, int rank, int64_t offset) const {
  const int n = mpi::as_count(count, "put");
  mpi::check(MPI_Put(src, n, MPI_FLOAT, rank, static_cast<MPI_Aint>(offset), n, MPI_FLOAT, win_),
             "MPI_Put", group_);
}

void MpiWindow::do_get(float* dst, int64_t count, int rank, int64_t offset) const {
  const int n = mpi::as_count(count, "get");
  mpi::check(MPI_Get(dst, n, MPI_FLOAT, rank, static_cast<MPI_Aint>(offset), n, MPI_FLOAT, win_),
             "MPI_Get", group_);
}

}  // namespace moecore::dist
