// GoogleTest's main for a test executable that mpirun may start: MPI is initialised when a launcher
// started the process (dist/mpi/mpi_runtime.h), else the world is this process alone.
#include <gtest/gtest.h>

#include "dist/mpi/mpi_runtime.h"

int main(int argc, char** argv) {
  moecore::dist::init_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
