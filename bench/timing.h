// Timing shared by the benchmarks: calibrated batches of calls, sampled in turn across the
// contenders, reported as the median (and best) time per call; and a background-load meter.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tandem::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct TimingOptions {
  double warmup_seconds = 0.05;  ///< per contender, before calibration
  double batch_seconds = 0.002;  ///< one sample times enough calls to last about this long
  int samples = 21;              ///< samples per contender
};

/// Seconds per call of one contender over its samples.
struct Timing {
  double median;  ///< the figure the tables report
  double best;    ///< the fastest sample: what is left when interference happened to miss it
};

/// Times each contender. Samples alternate between contenders in a fresh random order each
/// round, so a drift in clock speed or background load (or periodic interference) affects all
/// of them alike and the ratios stay fair.
inline std::vector<Timing> seconds_per_call(const std::vector<std::function<void()>>& fns,
                                            const TimingOptions& options = {}) {
  std::vector<int64_t> calls(fns.size());
  for (size_t f = 0; f < fns.size(); ++f) {
    // Warm-up also pays one-time costs (oneDNN JIT, allocator caches, page faults).
    const double warmup_end = now_seconds() + options.warmup_seconds;
    double one_call = 0;
    do {
      const double start = now_seconds();
      fns[f]();
      one_call = now_seconds() - start;
    } while (now_seconds() < warmup_end);
    calls[f] = std::max<int64_t>(1, static_cast<int64_t>(options.batch_seconds / one_call));
  }
  std::vector<std::vector<double>> per_call(fns.size());
  std::vector<size_t> order(fns.size());
  for (size_t f = 0; f < order.size(); ++f) order[f] = f;
  std::mt19937 engine(/*seed=*/12345);
  for (int s = 0; s < options.samples; ++s) {
    std::shuffle(order.begin(), order.end(), engine);
    for (const size_t f : order) {
      const double start = now_seconds();
      for (int64_t i = 0; i < calls[f]; ++i) fns[f]();
      per_call[f].push_back((now_seconds() - start) / static_cast<double>(calls[f]));
    }
  }
  std::vector<Timing> timings;
  for (auto& times : per_call) {
    std::sort(times.begin(), times.end());
    timings.push_back({times[times.size() / 2], times.front()});
  }
  return timings;
}

/// The medians of seconds_per_call, for tables that report nothing else.
inline std::vector<double> median_seconds_per_call(const std::vector<std::function<void()>>& fns,
                                                   const TimingOptions& options = {}) {
  std::vector<double> medians;
  for (const Timing& timing : seconds_per_call(fns, options)) medians.push_back(timing.median);
  return medians;
}

/// Measures how many cores other processes kept busy while it lives. On a shared 2-core machine
/// a parallel build next to the benchmark halves a thread's share and stalls OpenMP barriers,
/// so the benchmarks print this next to their tables: above ~0.1 cores, distrust the timings.
class BackgroundLoad {
 public:
  BackgroundLoad()
      : start_wall_(now_seconds()), start_busy_(machine_busy_seconds() - own_cpu_seconds()) {}
  /// Average cores used by other processes since construction (0 where /proc/stat is missing).
  double cores() const {
    const double busy = machine_busy_seconds() - own_cpu_seconds() - start_busy_;
    return std::max(0.0, busy / (now_seconds() - start_wall_));
  }

 private:
  /// CPU time of every process on the machine: the busy fields of /proc/stat's "cpu" line.
  static double machine_busy_seconds() {
    std::ifstream stat("/proc/stat");
    std::string label;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    return (user + nice + system + irq + softirq + steal) /
           static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  static double own_cpu_seconds() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  }

  double start_wall_;
  double start_busy_;
};

/// "cmake --build <build dir> --target <target> && <program> <args>", for the table footer.
inline std::string reproduce_command(const char* build_dir, int argc, char** argv) {
  const std::string program = argv[0];
  std::string command = std::string("cmake --build ") + build_dir + " --target " +
                        program.substr(program.find_last_of('/') + 1) + " && " + program;
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

}  // namespace tandem::bench
