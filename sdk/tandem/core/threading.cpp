// Thread budget bookkeeping; OpenMP's nthreads ICV is per thread, so each replica thread's
// omp_set_num_threads governs only the parallel regions that thread starts. The floating-point
// mode is per thread too (a control register).
#include "tandem/core/threading.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"

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
  // No team of this thread can be larger than OpenMP's thread limit (OMP_THREAD_LIMIT).
  t_compute_threads = std::min(t_compute_threads, std::max(1, omp_get_thread_limit()));
#endif
#ifdef _OPENMP
  omp_set_num_threads(t_compute_threads);
#endif
}

int compute_threads() { return t_compute_threads > 0 ? t_compute_threads : hardware_cores(); }

namespace {

/// A setting that is on unless the environment variable `name` is "0" or "false".
bool on_unless_turned_off(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || value[0] == '\0' ||
         (std::strcmp(value, "0") != 0 && std::strcmp(value, "false") != 0);
}

/// CPU time (seconds) the CPUs in `cpus` spent busy since boot, from /proc/stat's cpuN lines
/// (user, nice, system, irq, softirq, steal; not idle or iowait); negative when unreadable.
double busy_seconds(const std::vector<int>& cpus) {
  std::ifstream in("/proc/stat");
  if (!in) return -1.0;
  static const double tick = [] {
    const long hz = ::sysconf(_SC_CLK_TCK);
    return 1.0 / static_cast<double>(hz > 0 ? hz : 100);
  }();
  double ticks = 0.0;
  bool any = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 3, "cpu") != 0) break;                        // the cpu lines come first
    if (line.size() < 4 || line[3] < '0' || line[3] > '9') continue;  // the all-CPU line
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                       steal = 0;
    fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (!fields && !fields.eof()) continue;
    if (!std::binary_search(cpus.begin(), cpus.end(), cpu)) continue;
    ticks += static_cast<double>(user + nice + system + irq + softirq + steal);
    any = true;
  }
  return any ? ticks * tick : -1.0;
}

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double monotonic_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// free_cores' sampler: the last readings, and the smoothed load of other processes.
struct CoreShare {
  static constexpr double kInterval = 0.25;  // seconds between samples
  static constexpr double kTaken = 0.6;      // of a core, for it to count as another's
  bool enabled = on_unless_turned_off("TANDEM_SHARE_CORES");
  std::mutex mutex;               // one sampler at a time; the others read `free`
  std::atomic<double> next{0.0};  // monotonic time of the next sample
  std::atomic<int> free{0};       // 0: not sampled yet
  double last_time = -1.0, last_busy = 0.0, last_own = 0.0, others = 0.0;
  int samples = 0, reported = 0;

  void sample(double now) {
    const std::vector<int> cpus = process_cores();
    const int cores = hardware_cores();
    const double busy = busy_seconds(cpus), own = process_cpu_seconds();
    if (busy < 0.0) {  // no /proc/stat: every core counts as free
      free.store(cores, std::memory_order_relaxed);
      next.store(now + 3600.0, std::memory_order_relaxed);
      return;
    }
    if (last_time >= 0.0 && now > last_time) {
      const double used = std::max(0.0, (busy - last_busy) - (own - last_own)) / (now - last_time);
      others = samples++ == 0 ? used : 0.5 * others + 0.5 * used;
      const int taken = static_cast<int>(others + (1.0 - kTaken));
      const int now_free = std::clamp(cores - taken, 1, cores);
      const int before = free.exchange(now_free, std::memory_order_relaxed);
      if (before != 0 && before != now_free && reported < 10) {
        ++reported;
        TANDEM_LOG_INFO("other processes kept ", std::round(others * 10.0) / 10.0,
                        " of this process's ", cores, " cores busy: compute threads now use ",
                        now_free, " of them",
                        reported == 10 ? " (further changes are not reported)" : "",
                        " (TANDEM_SHARE_CORES=0 uses every core regardless)");
      }
    } else {
      free.store(cores, std::memory_order_relaxed);
    }
    last_time = now;
    last_busy = busy;
    last_own = own;
    next.store(now + kInterval, std::memory_order_relaxed);
  }
};

CoreShare& core_share() {
  static CoreShare share;
  return share;
}

}  // namespace

bool core_sharing() { return core_share().enabled; }

int free_cores() {
  CoreShare& share = core_share();
  if (!share.enabled) return hardware_cores();
  const double now = monotonic_seconds();
  if (now >= share.next.load(std::memory_order_relaxed)) {
    std::unique_lock<std::mutex> lock(share.mutex, std::try_to_lock);
    if (lock.owns_lock() && now >= share.next.load(std::memory_order_relaxed)) share.sample(now);
  }
  const int free = share.free.load(std::memory_order_relaxed);
  return free > 0 ? std::min(free, hardware_cores()) : hardware_cores();
}

namespace {

/// The kernel's struct sched_attr (its first version, 48 bytes), for sched_getattr/setattr.
struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t sched_policy = 0;
  uint64_t sched_flags = 0;
  int32_t sched_nice = 0;
  uint32_t sched_priority = 0;
  uint64_t sched_runtime = 0;  // for SCHED_OTHER (Linux 6.12+): the requested slice, ns
  uint64_t sched_deadline = 0;
  uint64_t sched_period = 0;
};
static_assert(sizeof(SchedAttr) == 48);

}  // namespace

bool request_short_time_slices() {
#if defined(__linux__) && defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
  if (!core_share().enabled) return false;
  constexpr uint64_t kSliceNs = 100'000;  // the shortest the kernel grants
  SchedAttr attr;
  if (::syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) return false;
  if (attr.sched_policy != SCHED_OTHER) return false;  // batch, idle or real-time: leave it be
  if (attr.sched_runtime == kSliceNs) return true;
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = kSliceNs;
  if (::syscall(SYS_sched_setattr, 0, &attr, 0) != 0) return false;
  // Kernels before 6.12 accept the call and ignore the slice.
  SchedAttr check;
  return ::syscall(SYS_sched_getattr, 0, &check, sizeof(check), 0) == 0 &&
         check.sched_runtime == kSliceNs;
#else
  return false;
#endif
}

int adapt_compute_threads(int budget, int sharers) {
  const int threads = std::clamp(free_cores() / std::max(1, sharers), 1, std::max(1, budget));
  if (threads != t_compute_threads) set_compute_threads(threads);
  return threads;
}

namespace {

std::atomic<bool>& flush_flag() {
  static std::atomic<bool> enabled{on_unless_turned_off("TANDEM_FLUSH_DENORMALS")};
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
