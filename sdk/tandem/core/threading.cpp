// Thread budget bookkeeping; OpenMP's nthreads ICV is per thread, so each replica thread's
// omp_set_num_threads governs only the parallel regions that thread starts. The floating-point
// mode is per thread too (a control register).
#include "tandem/core/threading.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tandem {

int hardware_cores() {
  static const int cores = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return cores;
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
