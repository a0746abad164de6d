// What this build of Tandem contains, readable at run time (public headers never see the
// TANDEM_WITH_* macros themselves).
#pragma once

#include <string>

namespace tandem {

/// The optional back ends this library was built with (the configure summary's ✓ marks).
struct BuildInfo {
  /// CUDA: GPU tensors, cuBLAS, cuRAND (TANDEM_ENABLE_CUDA).
  bool cuda = false;
  /// NCCL: collectives between GPUs (found with the CUDA toolkit).
  bool nccl = false;
  /// Open MPI: MultiWorkerMirroredStrategy under mpirun (TANDEM_ENABLE_MPI).
  bool mpi = false;
  /// Gloo: workers started from TF_CONFIG on several machines (TANDEM_ENABLE_GLOO).
  bool gloo = false;
  /// oneDNN: the CPU GEMMs and convolutions.
  bool onednn = false;
  /// HDF5: checkpoints and HDF5 datasets.
  bool hdf5 = false;
  /// Tandem's version, "0.1.0".
  std::string version;
};

/// What this build contains (fixed at compile time).
const BuildInfo& build_info();

}  // namespace tandem
