// In-process all-reduce bandwidth for 2 and 4 CPU replicas from 1 KiB to 256 MiB, next to
// single-thread memcpy bandwidth on the same machine, and the fixed cost of an empty
// strategy.run. Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
//
//   bench_allreduce_cpu [--min-kib N] [--max-mib N] [--samples N] [--out-of-place 1]
// In place is c10d's all_reduce; out of place is what ctx.all_reduce and
// optimizer.apply_gradients(ctx, ...) do (inputs kept, results in new tensors).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;
namespace tb = tandem::bench;

namespace {

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

/// Seconds per all_reduce (sum) of `bytes` per replica, median over samples. Timed inside one
/// strategy.run, between barriers, so the run hand-off is not counted.
double all_reduce_seconds(td::MirroredStrategy& strategy, size_t bytes, int samples,
                          bool out_of_place) {
  const int n = strategy.num_replicas_in_sync();
  const int64_t elements = static_cast<int64_t>(bytes / sizeof(float));
  std::vector<std::vector<td::Tensor>> buffers(static_cast<size_t>(n));
  std::vector<std::vector<td::Tensor>> outputs(static_cast<size_t>(n));
  for (auto& b : buffers) b = {td::Tensor::zeros({elements})};  // zeros stay zeros when summed
  if (out_of_place)
    for (auto& o : outputs) o = {td::Tensor::zeros({elements})};
  // About 0.1 s of traffic per sample (at ~10 GB/s), at least 3 calls, at most 20000.
  const int calls =
      static_cast<int>(std::clamp<double>(1e9 / static_cast<double>(bytes), 3, 20000));
  std::vector<double> times;
  strategy.run([&](td::ReplicaContext& ctx) {
    td::collectives::Communicator& comm = ctx.communicator();
    const size_t id = static_cast<size_t>(ctx.replica_id_in_sync_group());
    std::vector<td::Tensor>& mine = buffers[id];
    std::vector<td::Tensor>& out = out_of_place ? outputs[id] : buffers[id];
    auto reduce = [&] {
      if (out_of_place) {
        comm.all_reduce(static_cast<const std::vector<td::Tensor>&>(mine), out, td::ReduceOp::kSum)
            ->wait();
      } else {
        comm.all_reduce(mine, td::ReduceOp::kSum)->wait();
      }
    };
    reduce();  // warm-up: page faults, caches
    for (int s = 0; s < samples; ++s) {
      comm.barrier()->wait();
      const double start = tb::now_seconds();
      for (int i = 0; i < calls; ++i) reduce();
      comm.barrier()->wait();  // the last replica to finish ends the sample
      if (ctx.replica_id_in_sync_group() == 0) times.push_back((tb::now_seconds() - start) / calls);
    }
  });
  return median(times);
}

double memcpy_seconds(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  tb::TimingOptions options;
  options.batch_seconds = 0.02;
  options.samples = 7;
  return tb::median_seconds_per_call({[&] {
                                       std::memcpy(dst.data(), src.data(), bytes);
                                       asm volatile("" : : "r"(dst.data()) : "memory");
                                     }},
                                     options)[0];
}

std::string size_label(size_t bytes) {
  char text[32];
  if (bytes >= (size_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%zu MiB", bytes >> 20);
  } else {
    std::snprintf(text, sizeof(text), "%zu KiB", bytes >> 10);
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  size_t min_kib = 1;
  size_t max_mib = 256;
  int samples = 5;
  bool out_of_place = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--min-kib")
      min_kib = std::max<size_t>(1, static_cast<size_t>(std::atol(argv[i + 1])));
    if (flag == "--max-mib") max_mib = static_cast<size_t>(std::atol(argv[i + 1]));
    if (flag == "--samples") samples = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--out-of-place") out_of_place = std::atoi(argv[i + 1]) != 0;
  }

  {
    td::MirroredStrategy two = td::MirroredStrategy::cpu(2);
    td::MirroredStrategy four = td::MirroredStrategy::cpu(4);
    std::printf("In-process all-reduce (float32 sum, %s) on %d cores; GB/s = 1e9 bytes/s\n",
                out_of_place ? "out of place" : "in place", td::hardware_cores());
    std::printf(
        "algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests), ratio = algbw / "
        "single-thread memcpy\n\n");
    std::printf("%9s | %7s | %23s | %23s\n", "", "memcpy", "2 replicas", "4 replicas");
    std::printf("%9s | %7s | %7s %7s %7s | %7s %7s %7s\n", "size", "GB/s", "algbw", "busbw",
                "ratio", "algbw", "busbw", "ratio");
    std::printf("----------+---------+-------------------------+------------------------\n");
    for (size_t bytes = min_kib << 10; bytes <= (max_mib << 20); bytes *= 4) {
      const double copy = static_cast<double>(bytes) / memcpy_seconds(bytes) / 1e9;
      std::printf("%9s | %7.2f", size_label(bytes).c_str(), copy);
      for (td::MirroredStrategy* strategy : {&two, &four}) {
        const int n = strategy->num_replicas_in_sync();
        const double alg = static_cast<double>(bytes) /
                           all_reduce_seconds(*strategy, bytes, samples, out_of_place) / 1e9;
        const double bus = alg * 2.0 * (n - 1) / n;
        std::printf(" | %7.2f %7.2f %6.2fx", alg, bus, alg / copy);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  std::printf("\nFixed cost of an empty strategy.run (median):\n");
  // One strategy at a time: idle replica threads of another would poll for a moment after
  // each of its runs and take cores from the one being timed.
  auto time_runs = [](td::Strategy& strategy) {
    tb::TimingOptions options;
    options.batch_seconds = 0.01;
    const double seconds = tb::median_seconds_per_call(
        {[&] { strategy.run([](td::ReplicaContext&) {}); }}, options)[0];
    std::printf("  %-18s %d replica%s: %8.1f us per run\n", strategy.name().c_str(),
                strategy.num_replicas_in_sync(), strategy.num_replicas_in_sync() == 1 ? " " : "s",
                seconds * 1e6);
  };
  {
    td::OneDeviceStrategy one_device;
    time_runs(one_device);
  }
  for (int n : {1, 2, 4}) {
    td::MirroredStrategy mirrored = td::MirroredStrategy::cpu(n);
    time_runs(mirrored);
  }
  std::printf("\nreproduce: %s\n", tb::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
