#include "dist/mpi/mpi_check.h"

#include <limits>

#include "core/check.h"

namespace moecore::dist::mpi {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

void check(int code, const char* op, const std::string& group) {
  MOE_CHECK(code == MPI_SUCCESS, "[mpi] {} on group '{}' failed: {}", op, group, error_text(code));
}

int as_count(int64_t count, const char* op) {
  MOE_CHECK(count >= 0 && count <= std::numeric_limits<int>::max(),
            "[mpi] {}: count {} does not fit an MPI int", op, count);
  return static_cast<int>(count);
}

MPI_Datatype datatype(CommType type) {
  switch (type) {
    case CommType::kFloat32:
      return MPI_FLOAT;
    case CommType::kFloat64:
      return MPI_DOUBLE;
    case CommType::kInt64:
      return MPI_INT64_T;
    case CommType::kByte:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}

MPI_Op reduction(ReduceOp op) {
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
}

}  // namespace moecore::dist::mpi
