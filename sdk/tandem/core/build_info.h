// What this build of Tandem contains, readable at run time (public headers never see the
// TANDEM_WITH_* macros themselves).
#pragma once

#include <string>

namespace tandem {

struct BuildInfo {
  bool cuda = false;
  bool nccl = false;
  bool mpi = false;
  bool gloo = false;
  bool onednn = false;
  bool hdf5 = false;
  std::string version;
};

const BuildInfo& build_info();

}  // namespace tandem
