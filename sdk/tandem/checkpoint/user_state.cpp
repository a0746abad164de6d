// The program's own state in a checkpoint (internal/user_state.h): float64/float32 counters and
// TrackedState objects, and TrackedState's default check.
#include "tandem/checkpoint/internal/user_state.h"

#include <cstring>

#include "tandem/checkpoint/internal/layout.h"
#include "tandem/core/logging.h"

namespace tandem {

using detail::tracked;

// ---- TrackedState ------------------------------------------------------------------------------

void TrackedState::check_state(const State& state) const {
  const State expected = save_state();
  for (const auto& [key, value] : expected) {
    const auto it = state.find(key);
    TANDEM_CHECK(it != state.end(), "key \"", key, "\" (", value.dtype(), " ", value.shape(),
                 ") is missing");
    TANDEM_CHECK(it->second.dtype() == value.dtype() && it->second.shape() == value.shape(),
                 "key \"", key, "\" is ", it->second.dtype(), " ", it->second.shape(),
                 " in the checkpoint but ", value.dtype(), " ", value.shape(), " here");
  }
  for (const auto& [key, value] : state)
    TANDEM_CHECK(expected.contains(key), "key \"", key, "\" (", value.dtype(), " ", value.shape(),
                 ") is not part of this object's state");
}

namespace detail {

namespace {

bool stored_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt32 ||
         dtype == DType::kInt64 || dtype == DType::kUInt8;
}

template <typename T>
Tensor scalar_of(T value) {
  return Tensor::from_vector(std::vector<T>{value}, Shape{});
}

/// The scalar counters/<name> of dtype `want` (the tracked pointer's); raises naming both dtypes
/// when the file holds another, or naming the shape when it is not one value.
template <typename T>
T read_counter(const h5::Group& group, const std::string& name, const std::string& path) {
  const std::string where = "counters/" + name;
  const DType want = dtype_of<T>;
  const DType stored = group.dataset_dtype(where);
  if (stored != want)
    mismatch(path, str_cat(location(group, where), " is a ", stored, " counter but \"", name,
                           "\" is tracked as a ", want, " one (",
                           want == DType::kFloat64 ? "double" : "float",
                           "*); track it with the type it was saved with"));
  const Tensor value = group.read_tensor(where);
  TANDEM_CHECK(value.numel() == 1, location(group, where), " has shape ", value.shape(),
               "; a counter is one value");
  T out;
  std::memcpy(&out, value.raw_data(), sizeof(T));  // the stored bits, NaN payloads included
  return out;
}

}  // namespace

void write_user_state(const ImageGroup& group, const std::vector<Checkpoint::Entry>& entries) {
  for (const auto& [name, counter] : tracked<double>(entries))
    group.write_tensor("counters/" + name, scalar_of(*counter));
  for (const auto& [name, counter] : tracked<float>(entries))
    group.write_tensor("counters/" + name, scalar_of(*counter));
  for (const auto& [name, object] : tracked<TrackedState>(entries)) {
    const TrackedState::State state = object->save_state();
    const ImageGroup g = group.require_group(std::string(kUserState) + "/" + name);
    for (const auto& [key, value] : state) {
      TANDEM_CHECK(!key.empty() && key.find('/') == std::string::npos, "Checkpoint: user state \"",
                   name, "\": key \"", key, "\" must be non-empty and without '/'");
      TANDEM_CHECK(value.defined(), "Checkpoint: user state \"", name, "\": key \"", key,
                   "\" is an undefined tensor");
      TANDEM_CHECK(stored_dtype(value.dtype()), "Checkpoint: user state \"", name, "\": key \"",
                   key, "\" is ", value.dtype(),
                   "; a checkpoint stores float32, float64, int32, int64 and uint8");
      g.write_tensor(key, value);
    }
  }
}

LoadedUserState load_user_state(const h5::Group& group,
                                const std::vector<Checkpoint::Entry>& entries,
                                const std::string& path) {
  LoadedUserState out;
  auto present = [&](const std::string& where, const std::string& name, std::string_view kind) {
    if (group.exists(where)) return true;
    TANDEM_LOG_WARNING(path, ": ", kind, " \"", name, "\" is not in the checkpoint; it keeps its ",
                       "value");
    return false;
  };
  for (const auto& [name, counter] : tracked<double>(entries))
    if (present("counters/" + name, name, "counter"))
      out.doubles[name] = read_counter<double>(group, name, path);
  for (const auto& [name, counter] : tracked<float>(entries))
    if (present("counters/" + name, name, "counter"))
      out.floats[name] = read_counter<float>(group, name, path);
  for (const auto& [name, object] : tracked<TrackedState>(entries)) {
    const std::string where = std::string(kUserState) + "/" + name;
    if (!present(where, name, "user state")) continue;
    const h5::Group g = group.open_group(where);
    TrackedState::State state;
    for (const std::string& key : g.children()) {
      TANDEM_CHECK(g.is_dataset(key), location(g, key),
                   " is a group; user state holds one dataset per key");
      state[key] = g.read_tensor(key);
    }
    try {
      object->check_state(state);
    } catch (const std::exception& e) {
      mismatch(path, str_cat("user state \"", name, "\" (", location(group, where),
                             ") does not fit the object tracked as \"", name, "\": ", e.what()));
    }
    out.states[name] = std::move(state);
  }
  return out;
}

void apply_user_state(const LoadedUserState& loaded,
                      const std::vector<Checkpoint::Entry>& entries) {
  for (const auto& [name, counter] : tracked<double>(entries))
    if (const auto it = loaded.doubles.find(name); it != loaded.doubles.end())
      *counter = it->second;
  for (const auto& [name, counter] : tracked<float>(entries))
    if (const auto it = loaded.floats.find(name); it != loaded.floats.end()) *counter = it->second;
  for (const auto& [name, object] : tracked<TrackedState>(entries))
    if (const auto it = loaded.states.find(name); it != loaded.states.end())
      object->restore_state(it->second);
}

}  // namespace detail

}  // namespace tandem
