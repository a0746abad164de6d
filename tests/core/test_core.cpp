// Tests of core: devices, dtypes, shapes, errors and device discovery.
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "tandem/tandem.h"

using namespace tandem;

TEST_CASE("Device parses tf and Tandem spellings", "[cpu][core]") {
  CHECK(Device::parse("cpu") == Device::cpu(0));
  CHECK(Device::parse("cpu:3") == Device::cpu(3));
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("gpu:2") == Device::cuda(2));
  CHECK(Device::parse("/device:GPU:0") == Device::cuda(0));
  CHECK(Device::parse("/job:worker/replica:0/task:1/device:CPU:0") == Device::cpu(0));
  CHECK(Device::cuda(4).to_string() == "cuda:4");
  CHECK_THROWS_WITH(Device::parse("tpu:0"), Catch::Contains("unknown kind \"tpu\""));
  CHECK_THROWS_WITH(Device::parse("cpu:x"), Catch::Contains("non-negative integer"));
}

TEST_CASE("DType sizes and names", "[cpu][core]") {
  CHECK(dtype_size(DType::kFloat32) == 4);
  CHECK(dtype_size(DType::kFloat64) == 8);
  CHECK(dtype_size(DType::kInt32) == 4);
  CHECK(dtype_size(DType::kInt64) == 8);
  CHECK(dtype_size(DType::kUInt8) == 1);
  CHECK(dtype_size(DType::kBool) == 1);
  CHECK(dtype_name(DType::kFloat64) == "float64");
  CHECK(dtype_of<int64_t> == DType::kInt64);
  CHECK(is_floating(DType::kFloat32));
  CHECK_FALSE(is_floating(DType::kInt32));
}

TEST_CASE("Shape arithmetic and axis checks", "[cpu][core]") {
  Shape s{2, 3, 4};
  CHECK(s.numel() == 24);
  CHECK(s.rank() == 3);
  CHECK(s[-1] == 4);
  CHECK(s.strides() == std::vector<int64_t>{12, 4, 1});
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{5, 0}.numel() == 0);
  CHECK(s.to_string() == "[2, 3, 4]");
  CHECK_THROWS_WITH(s.normalize_axis(3),
                    Catch::Contains("axis 3 is out of range for shape [2, 3, 4]"));
}

TEST_CASE("Shape::numel raises instead of wrapping", "[cpu][core]") {
  // 4 x 2^31 x 2^31 = 2^64 wraps to 0 in int64; a damaged file header declared exactly this.
  const int64_t two31 = int64_t{1} << 31;
  CHECK_THROWS_WITH((Shape{4, two31, two31}.numel()),
                    Catch::Contains("shape [4, 2147483648, 2147483648]") &&
                        Catch::Contains("more elements than int64 can count"));
  CHECK_THROWS_WITH((Shape{two31, two31, 3}.numel()), Catch::Contains("int64 can count"));
  CHECK(Shape{two31, two31}.numel() == (int64_t{1} << 62));
  CHECK(Shape{two31, two31, 0}.numel() == 0);
}

TEST_CASE("Shape::strides and Shape::nbytes raise instead of wrapping", "[cpu][core]") {
  const int64_t two40 = int64_t{1} << 40, two62 = int64_t{1} << 62;
  // numel() is 0, but stride 0 would be 2^80 (wrapped: 0, signed overflow).
  CHECK(Shape{0, two40, two40}.numel() == 0);
  CHECK_THROWS_WITH((Shape{0, two40, two40}.strides()),
                    Catch::Contains("shape [0, 1099511627776, 1099511627776]") &&
                        Catch::Contains("strides that int64 cannot count"));
  CHECK(Shape{0, 3, 4}.strides() == std::vector<int64_t>{12, 4, 1});
  // 2^62 float32 elements fit in int64, their 2^64 bytes do not (wrapped: a 0-byte buffer).
  CHECK(Shape{2, 3}.nbytes(4) == 24);
  CHECK(Shape{}.nbytes(8) == 8);
  CHECK(Shape{7, 0}.nbytes(4) == 0);
  CHECK(Shape{two62}.nbytes(1) == static_cast<size_t>(two62));
  CHECK_THROWS_WITH(Shape{two62}.nbytes(4),
                    Catch::Contains("shape [4611686018427387904] of 4-byte elements") &&
                        Catch::Contains("more bytes than int64 can count"));
  CHECK_THROWS_WITH((Shape{4, two62}.nbytes(1)), Catch::Contains("more elements than int64"));
  CHECK_THROWS_WITH((Shape{-1, 3}.nbytes(4)), Catch::Contains("shape [-1, 3] has a negative"));
}

TEST_CASE("TANDEM_CHECK puts the values in the message and keeps the location apart",
          "[cpu][core]") {
  // The suite runs below debug level (TANDEM_LOG_LEVEL unset or "warning"), where what() is
  // the message alone; at debug level the location joins it.
  REQUIRE_FALSE(log_enabled(LogLevel::kDebug));
  const int have = 7;
  try {
    TANDEM_CHECK(have == 8, "expected 8, got ", have);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "expected 8, got 7");
    CHECK_THAT(e.location(),
               Catch::StartsWith("test_core.cpp:") && Catch::EndsWith(", check failed: have == 8"));
  }
  try {
    TANDEM_THROW("no such layer ", "dense_9");
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "no such layer dense_9");
    CHECK_THAT(e.location(), Catch::StartsWith("test_core.cpp:"));
    CHECK_THAT(e.location(), !Catch::Contains("check failed"));
  }
}

TEST_CASE("device discovery never throws and explains zero GPUs", "[cpu][core]") {
  const CudaAvailability& a = cuda_availability();
  CHECK(a.built == build_info().cuda);
  if (a.devices.empty()) {
    CHECK_FALSE(a.reason.empty());
  } else {
    for (const auto& d : a.devices) CHECK(d.total_memory_bytes > 0);
  }
  CHECK(cuda_device_count() == static_cast<int>(a.devices.size()));
}

TEST_CASE("ScopedFloatMode flushes subnormals on its thread and restores the mode", "[cpu][core]") {
#if defined(__x86_64__) || defined(__aarch64__)
  volatile float tiny = 1e-20f;  // tiny * tiny = 1e-40, a subnormal float
  const uint32_t before = float_mode();
  CHECK(before == 0);  // IEEE subnormals outside replicas
  CHECK(tiny * tiny != 0.0f);
  {
    const ScopedFloatMode scope;
    CHECK(float_mode() != 0);
    CHECK(tiny * tiny == 0.0f);
    float other = -1.0f;  // a thread started here inherits the mode, as an OpenMP team does
    std::thread([&] { other = tiny * tiny; }).join();
    CHECK(other == 0.0f);
  }
  CHECK(float_mode() == before);
  CHECK(tiny * tiny != 0.0f);
  const bool was = set_flush_denormals(false);  // TANDEM_FLUSH_DENORMALS=0
  CHECK(was);
  {
    const ScopedFloatMode scope;
    CHECK(float_mode() == 0);
    CHECK(tiny * tiny != 0.0f);
  }
  set_flush_denormals(was);
#else
  WARN("no flush-to-zero control on this CPU: nothing to check");
#endif
}

TEST_CASE("the compute-thread budget is per thread", "[cpu][core]") {
  const int cores = hardware_cores();
  CHECK(cores >= 1);
  set_compute_threads(1);
  int other = 0;
  std::thread([&] { other = compute_threads(); }).join();
  CHECK(compute_threads() == 1);
  CHECK(other == cores);
  set_compute_threads(cores);
}

TEST_CASE("cpu_isa is the CPU's class, capped by TANDEM_MAX_CPU_ISA", "[cpu][core]") {
  const CpuIsa detected = cpu_isa_detected();
  const char* cap = std::getenv("TANDEM_MAX_CPU_ISA");
  INFO("detected " << cpu_isa_name(detected) << ", TANDEM_MAX_CPU_ISA " << (cap ? cap : "unset")
                   << ", in use " << cpu_isa_name(cpu_isa()));
  std::optional<CpuIsa> limit;
  for (CpuIsa isa :
       {CpuIsa::kAvx2, CpuIsa::kAvx512Core, CpuIsa::kAvx512CoreBf16, CpuIsa::kAvx512CoreAmx})
    if (cap != nullptr && cpu_isa_name(isa) == cap) limit = isa;
  const CpuIsa expected = limit ? std::min(detected, *limit) : detected;
  CHECK(cpu_isa() == expected);
  CHECK(cpu_isa_capped() == (expected != detected));
  const std::string description = cpu_isa_description();
  CHECK(description.rfind(std::string(cpu_isa_name(expected)), 0) == 0);
  CHECK((description.find("TANDEM_MAX_CPU_ISA") != std::string::npos) == cpu_isa_capped());
#if defined(__x86_64__)
  // What the compiler's own test of the CPU says agrees.
  CHECK((detected >= CpuIsa::kAvx2) ==
        (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")));
  CHECK((detected >= CpuIsa::kAvx512Core) ==
        (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")));
#endif
}

TEST_CASE("free_cores takes off the cores another process keeps busy", "[cpu][core]") {
  const int cores = hardware_cores();
  if (cores < 2 || !core_sharing()) {
    WARN("skipped: needs 2 cores and core sharing on (this process: "
         << cores << " cores, TANDEM_SHARE_CORES=0: " << !core_sharing() << ")");
    return;
  }
  CHECK(free_cores() >= 1);
  CHECK(free_cores() <= cores);
  const pid_t busy = ::fork();
  REQUIRE(busy >= 0);
  if (busy == 0) {
    for (;;) asm volatile("" ::: "memory");  // spins until killed
  }
  // The sampler smooths over quarter seconds: the busy core shows within a second or two.
  int free = cores;
  for (int i = 0; i < 60 && free > cores - 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    free = free_cores();
  }
  const int threads = adapt_compute_threads(cores, 1);
  const int half = adapt_compute_threads(cores, 2);
  ::kill(busy, SIGKILL);
  ::waitpid(busy, nullptr, 0);
  CHECK(free <= cores - 1);
  CHECK(free >= 1);
  // A replica's team narrows to its share of the free cores, never below one thread.
  CHECK(threads <= cores - 1);
  CHECK(threads >= 1);
  CHECK(half == std::max(1, std::min(cores / 2, free_cores() / 2)));
  CHECK(compute_threads() == half);
  set_compute_threads(cores);
}

TEST_CASE("request_short_time_slices keeps a thread's policy and nice value", "[cpu][core]") {
  // A thread at nice 5 asks: where the kernel grants the slice (Linux 6.12+) the thread runs in
  // 0.1 ms slices at nice 5 still; where it does not, nothing about the thread changed.
  int nice_after = -100, policy_after = -1;
  bool granted = false;
  std::thread([&] {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    REQUIRE(::setpriority(PRIO_PROCESS, tid, 5) == 0);
    granted = request_short_time_slices();
    errno = 0;
    nice_after = ::getpriority(PRIO_PROCESS, tid);
    policy_after = ::sched_getscheduler(0);
  }).join();
  CHECK(nice_after == 5);
  CHECK(policy_after == SCHED_OTHER);
  if (!granted) WARN("this kernel keeps its own time slices (short ones need Linux 6.12)");

  // A batch thread is left alone.
  bool batch_granted = true;
  int batch_policy = -1;
  std::thread([&] {
    const sched_param param{};
    REQUIRE(::sched_setscheduler(0, SCHED_BATCH, &param) == 0);
    batch_granted = request_short_time_slices();
    batch_policy = ::sched_getscheduler(0);
  }).join();
  CHECK_FALSE(batch_granted);
  CHECK(batch_policy == SCHED_BATCH);
}
