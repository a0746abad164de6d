// Every dataset of an HDF5 file (a checkpoint) as bytes by path, for tests that compare two
// files bit for bit.
#pragma once

#include <map>
#include <string>

#include "tandem/io/internal/hdf5_file.h"

namespace tandem::testing {

/// Adds every dataset under `group` to `out`, by its path below `path` ("/model_weights/...").
inline void read_datasets(const h5::Group& group, const std::string& path,
                          std::map<std::string, std::string>& out) {
  for (const std::string& name : group.children()) {
    if (group.is_dataset(name)) {
      const Tensor t = group.read_tensor(name);
      out[path + "/" + name] = std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      read_datasets(group.open_group(name), path + "/" + name, out);
    }
  }
}

/// Every dataset of the HDF5 file at `file`, by path, as bytes.
inline std::map<std::string, std::string> datasets_of(const std::string& file) {
  std::map<std::string, std::string> out;
  read_datasets(h5::File::open(file).root(), "", out);
  return out;
}

}  // namespace tandem::testing
