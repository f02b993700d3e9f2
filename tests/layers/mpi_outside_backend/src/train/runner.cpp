#include <mpi.h>
// A trainer file that talks to MPI directly: the layer check must reject it.
