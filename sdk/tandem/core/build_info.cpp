// Records the TANDEM_WITH_* configuration (a dispatch point: it reads the build macros).
#include "tandem/core/build_info.h"

namespace tandem {

const BuildInfo& build_info() {
  static const BuildInfo info{
      .cuda = TANDEM_WITH_CUDA != 0,
      .nccl = TANDEM_WITH_NCCL != 0,
      .mpi = TANDEM_WITH_MPI != 0,
      .gloo = TANDEM_WITH_GLOO != 0,
      .onednn = TANDEM_WITH_ONEDNN != 0,
      .hdf5 = TANDEM_WITH_HDF5 != 0,
      .version = TANDEM_VERSION_STRING,
  };
  return info;
}

}  // namespace tandem
