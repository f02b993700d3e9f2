// Checked MPI calls and the MPI names of moecore's element types: a failure becomes moecore::Error
// naming the MPI function, the group and MPI's own error string (every communicator returns
// errors instead of aborting, MPI_ERRORS_RETURN).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "dist/communicator.h"

namespace moecore::dist::mpi {

std::string error_text(int code);
void check(int code, const char* op, const std::string& group);
// MPI counts are int: a message over 2^31 elements must be split by the caller (it never is here).
int as_count(int64_t count, const char* op);
MPI_Datatype datatype(CommType type);
MPI_Op reduction(ReduceOp op);

}  // namespace moecore::dist::mpi
