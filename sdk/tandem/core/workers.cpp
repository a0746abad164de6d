// The process's WorkerGroup slot.
#include "tandem/core/workers.h"

#include <mutex>

namespace tandem {

namespace {
std::mutex g_mutex;
std::shared_ptr<WorkerGroup> g_group;
}  // namespace

std::shared_ptr<WorkerGroup> worker_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_group;
}

std::shared_ptr<WorkerGroup> set_worker_group(std::shared_ptr<WorkerGroup> group) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::swap(g_group, group);
  return group;
}

}  // namespace tandem
