#include "dist/mpi/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>

#include "dist/mpi/mpi_communicator.h"

namespace moecore::dist {

namespace {

bool g_active = false;

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace

bool init_mpi(int* argc, char*** argv) {
  if (g_active || !launched_by_mpi()) return g_active;
  int provided = 0;
  // Only the main thread calls MPI (OpenMP threads never do).
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes and become moecore::Error instead of aborting without a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_active = true;
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  return true;
}

bool mpi_active() {
  return g_active;
}

std::unique_ptr<Communicator> mpi_world() {
  return std::make_unique<MpiCommunicator>(g_active ? MPI_COMM_WORLD : MPI_COMM_NULL, "world");
}

void abort_job(int exit_code) {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace moecore::dist
