// Telling whether another worker process still runs (internal/process_watch.h).
#include "tandem/collectives/internal/process_watch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tandem/core/threading.h"

namespace tandem::collectives {

namespace {

/// Fields 3 (the state letter) and 22 (the start time) of /proc/PID/stat; false when it cannot
/// be read.
bool read_stat(int pid, std::string* state, uint64_t* start_time) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  const size_t name_end = text.rfind(')');
  if (name_end == std::string::npos || name_end + 2 >= text.size()) return false;
  std::istringstream fields(text.substr(name_end + 2));
  fields >> *state;
  std::string skip;
  for (int field = 4; field < 22 && fields >> skip; ++field) {
  }
  uint64_t start = 0;
  fields >> start;
  *start_time = start;
  return true;
}

}  // namespace

bool process_state(int pid, uint64_t* start_time) {
  std::string state;
  uint64_t start = 0;
  if (!read_stat(pid, &state, &start)) return false;
  if (start_time) *start_time = start;
  return state != "Z" && state != "X" && state != "x";
}

bool process_gone(int pid, uint64_t start_time) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  if (::access(path.c_str(), F_OK) != 0) return errno == ENOENT;
  uint64_t started = 0;
  std::ifstream probe(path);
  if (!probe) return false;  // there, but unreadable: not known to have ended
  probe.close();
  return !process_state(pid, &started) || started != start_time;
}

std::string namespace_id(const char* kind) {
  struct stat info {};
  const std::string path = std::string("/proc/self/ns/") + kind;
  if (::stat(path.c_str(), &info) != 0) return "?";
  return std::to_string(info.st_dev) + ":" + std::to_string(info.st_ino);
}

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

ProcessIdentity this_process() {
  ProcessIdentity me;
  me.pid = static_cast<int32_t>(::getpid());
  process_state(me.pid, &me.start_time);
  const std::string pid_namespace = namespace_id("pid");
  // /proc must be this pid namespace's (unshare -p without a new /proc shows another's): its
  // entry for this process has this process's pid.
  std::ifstream self("/proc/self/stat");
  long pid_in_proc = 0;
  self >> pid_in_proc;
  // Without a usable procfs nothing can be checked: a machine hash of 0 matches no one.
  me.machine = pid_namespace == "?" || pid_in_proc != me.pid
                   ? 0
                   : fnv1a(kernel_identity() + "|pid " + pid_namespace);
  ::gethostname(me.host, sizeof(me.host) - 1);
  return me;
}

bool process_ended(const ProcessIdentity& other) {
  static const ProcessIdentity me = this_process();
  if (me.machine == 0 || other.machine != me.machine || other.pid <= 0) return false;
  return process_gone(other.pid, other.start_time);
}

bool process_stopped(const ProcessIdentity& other) {
  static const ProcessIdentity me = this_process();
  if (me.machine == 0 || other.machine != me.machine || other.pid <= 0) return false;
  std::string state;
  uint64_t start = 0;
  // "T": stopped by a signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU); "t": stopped by a tracer.
  return read_stat(other.pid, &state, &start) && start == other.start_time &&
         (state == "T" || state == "t");
}

}  // namespace tandem::collectives
