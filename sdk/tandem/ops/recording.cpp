// The per-thread list of active recorders and the pause flag behind NoRecordGuard. An op is
// recorded on each active recorder that tracks one of its inputs.
#include "tandem/ops/recording.h"

#include <algorithm>

namespace tandem::ops {

namespace {
thread_local std::vector<Recorder*> t_recorders;
thread_local bool t_paused = false;
}  // namespace

void register_recorder(Recorder* recorder) { t_recorders.push_back(recorder); }

void unregister_recorder(Recorder* recorder) {
  t_recorders.erase(std::remove(t_recorders.begin(), t_recorders.end(), recorder),
                    t_recorders.end());
}

NoRecordGuard::NoRecordGuard() : previous_(t_paused) { t_paused = true; }
NoRecordGuard::~NoRecordGuard() { t_paused = previous_; }

bool needs_recording(std::initializer_list<const Tensor*> inputs) {
  if (t_recorders.empty() || t_paused) return false;
  for (const Recorder* recorder : t_recorders)
    for (const Tensor* t : inputs)
      if (recorder->tracks(*t)) return true;
  return false;
}

bool needs_recording(const std::vector<Tensor>& inputs) {
  if (t_recorders.empty() || t_paused) return false;
  for (const Recorder* recorder : t_recorders)
    for (const Tensor& t : inputs)
      if (recorder->tracks(t)) return true;
  return false;
}

void record(std::string_view op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            BackwardFn backward) {
  if (t_recorders.empty() || t_paused) return;
  for (Recorder* recorder : t_recorders) {
    const bool relevant = std::any_of(inputs.begin(), inputs.end(),
                                      [&](const Tensor& t) { return recorder->tracks(t); });
    if (relevant) recorder->add_node(op, inputs, outputs, backward);
  }
}

void watch_on_active_recorders(const Tensor& value) {
  if (t_recorders.empty() || t_paused) return;
  for (Recorder* recorder : t_recorders) recorder->on_variable_read(value);
}

}  // namespace tandem::ops
