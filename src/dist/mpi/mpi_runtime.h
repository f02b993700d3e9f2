// The MPI process runtime: starting MPI when a launcher (mpirun/srun) started the process, the
// world group, and ending a whole job after an error. When the process was not started by an MPI
// launcher, moecore runs as a single process and the world is a group of one, so model and
// trainer code have one path for both cases.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace moecore::dist {

// Initialises MPI when launched by mpirun/srun (detected from the launcher's environment) and
// finalises it at exit. Returns true when MPI is active.
bool init_mpi(int* argc, char*** argv);
bool mpi_active();
// Every process of the job (MPI_COMM_WORLD), or a group of one when MPI is not active.
std::unique_ptr<Communicator> mpi_world();
// Ends the whole job (every rank) after an error on one rank, so that no rank waits forever in a
// collective for a peer that has stopped.
[[noreturn]] void abort_job(int exit_code);

}  // namespace moecore::dist
