// Thread budget bookkeeping; OpenMP's nthreads ICV is per thread, so each replica thread's
// omp_set_num_threads governs only the parallel regions that thread starts. The floating-point
// mode is per thread too (a control register).
#include "tandem/core/threading.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tandem/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tandem {

std::vector<int> process_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
  }
  return cores;
}

namespace {

std::atomic<int>& cores_slot() {
  static std::atomic<int> cores{[] {
    const int n = static_cast<int>(process_cores().size());
    return n > 0 ? n : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }()};
  return cores;
}

}  // namespace

int hardware_cores() { return cores_slot().load(std::memory_order_relaxed); }

void bind_process_to_cores(const std::vector<int>& cores) {
  TANDEM_CHECK(!cores.empty(), "bind_process_to_cores: no cores given");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cores) {
    TANDEM_CHECK(cpu >= 0 && cpu < CPU_SETSIZE, "bind_process_to_cores: no CPU ", cpu);
    CPU_SET(cpu, &set);
  }
  // sched_setaffinity applies to one thread: every thread running now (an OpenMP team, a
  // prefetch thread) is moved, and threads started later inherit the caller's mask.
  DIR* tasks = ::opendir("/proc/self/task");
  TANDEM_CHECK(tasks != nullptr,
               "bind_process_to_cores: cannot list /proc/self/task: ", std::strerror(errno));
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const pid_t tid = static_cast<pid_t>(std::atoi(entry->d_name));
    // A thread that ended since the listing is no error.
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) {
      const int error = errno;
      ::closedir(tasks);
      TANDEM_THROW("cannot bind the process to cores ", format_cores(cores), ": ",
                   std::strerror(error));
    }
  }
  ::closedir(tasks);
  TANDEM_CHECK(sched_setaffinity(0, sizeof(set), &set) == 0, "cannot bind the process to cores ",
               format_cores(cores), ": ", std::strerror(errno));
  cores_slot().store(static_cast<int>(cores.size()), std::memory_order_relaxed);
}

std::vector<std::vector<int>> physical_cores(const std::vector<int>& cpus) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // "package/core" -> CPUs
  for (const int cpu : cpus) {
    const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string package, core;
    std::ifstream(topology + "physical_package_id") >> package;
    std::ifstream(topology + "core_id") >> core;
    const std::string key =
        package.empty() || core.empty() ? "cpu" + std::to_string(cpu) : package + "/" + core;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& group) { return group.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {cpu}});
    } else {
      it->second.push_back(cpu);
    }
  }
  std::vector<std::vector<int>> out;
  for (auto& group : groups) out.push_back(std::move(group.second));
  return out;
}

std::string format_cores(const std::vector<int>& cores) {
  std::ostringstream out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    out << (i > 0 ? "," : "") << cores[i];
    if (j > i) out << "-" << cores[j];
    i = j + 1;
  }
  return out.str();
}

std::string kernel_identity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  if (!id.empty()) return id;
  // No procfs: the host name is the next best thing.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string("host:") + host;
}

namespace {
thread_local int t_compute_threads = 0;
}

void set_compute_threads(int threads) {
  t_compute_threads = std::max(1, threads);
#ifdef _OPENMP
  omp_set_num_threads(t_compute_threads);
#endif
}

int compute_threads() { return t_compute_threads > 0 ? t_compute_threads : hardware_cores(); }

namespace {

std::atomic<bool>& flush_flag() {
  static std::atomic<bool> enabled{[] {
    const char* value = std::getenv("TANDEM_FLUSH_DENORMALS");
    return value == nullptr || value[0] == '\0' ||
           (std::strcmp(value, "0") != 0 && std::strcmp(value, "false") != 0);
  }()};
  return enabled;
}

#if defined(__x86_64__) || defined(__i386__)
constexpr uint32_t kFlushBits = 0x8000 | 0x0040;  // MXCSR: flush-to-zero | denormals-are-zero
uint32_t read_control() { return _mm_getcsr(); }
void write_control(uint32_t value) { _mm_setcsr(value); }
#elif defined(__aarch64__)
constexpr uint32_t kFlushBits = uint32_t{1} << 24;  // FPCR.FZ
uint32_t read_control() {
  uint64_t fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return static_cast<uint32_t>(fpcr);
}
void write_control(uint32_t value) {
  const uint64_t fpcr = value;
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
}
#else
constexpr uint32_t kFlushBits = 0;
uint32_t read_control() { return 0; }
void write_control(uint32_t) {}
#endif

}  // namespace

bool flush_denormals() { return flush_flag().load(std::memory_order_relaxed); }

bool set_flush_denormals(bool enabled) { return flush_flag().exchange(enabled); }

uint32_t float_mode() { return read_control() & kFlushBits; }

void set_float_mode(uint32_t mode) {
  const uint32_t control = read_control();
  const uint32_t wanted = (control & ~kFlushBits) | (mode & kFlushBits);
  if (wanted != control) write_control(wanted);
}

ScopedFloatMode::ScopedFloatMode() : saved_(float_mode()) {
  set_float_mode(flush_denormals() ? kFlushBits : 0);
}

ScopedFloatMode::~ScopedFloatMode() { set_float_mode(saved_); }

}  // namespace tandem
