// verify_checkpoint (inspect.h): checks, without the model that wrote it, that a checkpoint
// would restore: every dataset read back (so every checksum verified) and every value possible.
#include <set>
#include <string>

#include "tandem/checkpoint/inspect.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/checkpoint/internal/metric_state.h"

namespace tandem {

using detail::check_counter;
using detail::check_own_signature;
using detail::check_values;
using detail::kFormatName;
using detail::kIterationName;
using detail::kModelWeights;
using detail::kOptimizerWeights;
using detail::kStandardCounters;
using detail::kTrainingState;
using detail::location;
using detail::read_iterator_state;
using detail::require_group;
using detail::verify_metric_state;

namespace {

/// How deep groups may nest below the group a walk starts from (a checkpoint needs 4:
/// v/<layer>/<variable>), and how many objects one walk visits at most.
constexpr int kMaxDepth = 16;
constexpr size_t kMaxObjects = 1'000'000;

/// What a walk of a file has seen: every group by its object id, so that a cycle of hard links
/// (group A holding B holding A) ends the walk with an error instead of recursing forever.
struct Walk {
  std::set<std::string> groups;
  size_t objects = 0;
};

/// Reads every dataset below `group` (so HDF5 verifies each checksum) and checks the values
/// that cannot be valid, as a restore does (`slots`: optimizer slots, "v/..." >= 0; `any_value`:
/// the program's counters and user state, which may hold anything, NaN included).
void verify_datasets(const h5::Group& group, bool slots, Walk& walk, const std::string& prefix = "",
                     int depth = 0, bool any_value = false) {
  TANDEM_CHECK(walk.groups.insert(group.object_id(".")).second, group.file(), ":", group.path(),
               ": the group is reached again through a cycle of links; the file is damaged");
  TANDEM_CHECK(depth <= kMaxDepth, group.file(), ":", group.path(), ": groups nest deeper than ",
               kMaxDepth, " levels; not a Tandem checkpoint");
  for (const std::string& child : group.children()) {
    TANDEM_CHECK(++walk.objects <= kMaxObjects, group.file(), ": more than ", kMaxObjects,
                 " objects; not a Tandem checkpoint");
    // `name`: the path below the group verify_datasets started from ("v/dense/kernel:0").
    const std::string name = prefix.empty() ? child : prefix + "/" + child;
    if (group.is_dataset(child)) {
      const Tensor value = group.read_tensor(child);
      if (!any_value)
        check_values(location(group, child), value,
                     /*non_negative=*/slots && name.starts_with("v/"),
                     "the second moment v is an average of squares");
    } else {
      verify_datasets(group.open_group(child), slots, walk, name, depth + 1, any_value);
    }
  }
}

}  // namespace

std::string verify_checkpoint(const std::string& path) {
  try {
    h5::File file = detail::open_checkpoint(path);
    const h5::Group& root = file.root();
    TANDEM_CHECK(
        root.has_attr("tandem_format") && root.read_attr_string("tandem_format") == kFormatName,
        path, ": not a Tandem checkpoint (no tandem_format=\"", kFormatName,
        "\" attribute at the root)");
    const int64_t version = root.read_attr_int64("tandem_format_version");
    TANDEM_CHECK(version >= 1 && version <= kCheckpointFormatVersion, path,
                 ": checkpoint format version ", version, "; this build reads versions 1 to ",
                 kCheckpointFormatVersion);
    for (const char* group : {kModelWeights, kTrainingState}) require_group(root, group, path);
    check_own_signature(root, path);
    Walk walk;
    verify_datasets(root.open_group(kModelWeights), /*slots=*/false, walk);
    if (root.exists(kOptimizerWeights)) {
      const h5::Group optimizer = root.open_group(kOptimizerWeights);
      check_counter(location(optimizer, kIterationName),
                    optimizer.read_scalar_int64(kIterationName));
      verify_datasets(optimizer, /*slots=*/true, walk);
    }
    const h5::Group state = root.open_group(kTrainingState);
    for (const char* name : kStandardCounters)
      if (state.exists(name)) check_counter(location(state, name), state.read_scalar_int64(name));
    if (state.exists("metrics")) {
      const h5::Group metrics = state.open_group("metrics");
      for (const std::string& name : metrics.children())
        verify_metric_state(metrics.open_group(name));
    }
    if (state.exists("data")) {
      const h5::Group data = state.open_group("data");
      for (const std::string& name : data.children()) read_iterator_state(data.open_group(name));
    }
    if (state.exists("grad_accum")) verify_datasets(state.open_group("grad_accum"), false, walk);
    if (state.exists("loss_scale")) verify_datasets(state.open_group("loss_scale"), false, walk);
    if (state.exists("rng/replica_state")) state.read_u64("rng/replica_state");
    for (const char* name : {"counters", "user"})
      if (state.exists(name))
        verify_datasets(state.open_group(name), false, walk, "", 0, /*any_value=*/true);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace tandem
