// Multi-process all-reduce between workers started from TF_CONFIG: Tandem's path
// (MultiWorkerMirroredStrategy's communicator, one CPU replica per worker, Gloo's ring
// all-reduce behind the call's signature check) against gloo::allreduce called directly on the
// same buffer, 1 KiB to 256 MiB, float32 sum. Start the workers with their TF_CONFIG on one host:
//
//   tests/mpi/tf_config_workers.sh 2 ./build/bench/bench_allreduce_gloo [--min-kib 1]
//       [--max-mib 256] [--samples 7]
//
// The chief prints the table: median seconds per call (over samples, each timing a batch of
// calls between barriers), algbw = bytes / time, and the ratio Tandem / Gloo (target >= 0.9 at
// >= 16 MiB).
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;
namespace tb = tandem::bench;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int calls_for(size_t bytes) {
  return static_cast<int>(std::clamp<double>(2e8 / static_cast<double>(bytes), 2, 2000));
}

}  // namespace

int main(int argc, char** argv) {
  int min_kib = 1, max_mib = 256, samples = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--min-kib") {
      min_kib = std::atoi(argv[i + 1]);
    } else if (flag == "--max-mib") {
      max_mib = std::atoi(argv[i + 1]);
    } else if (flag == "--samples") {
      samples = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "bench_allreduce_gloo: unknown flag \"%s\"\n", argv[i]);
      return 2;
    }
  }
  if (min_kib < 1 || max_mib < 1 || samples < 1) {
    std::fprintf(stderr,
                 "bench_allreduce_gloo: --min-kib, --max-mib and --samples need numbers >= 1\n");
    return 2;
  }
  const td::ClusterSpec cluster = td::ClusterResolver::from_environment();
  if (cluster.source != "tf_config" || cluster.size < 2) {
    std::fprintf(stderr,
                 "bench_allreduce_gloo: start 2 or more workers with TF_CONFIG "
                 "(tests/mpi/tf_config_workers.sh 2 %s)\n",
                 argv[0]);
    return 2;
  }
  td::MultiWorkerMirroredStrategy strategy(std::vector<td::Device>{td::Device::cpu(0)});
  td::collectives::Communicator& comm = td::detail::StrategyAccess::communicator(strategy, 0);
  const bool chief = strategy.is_chief();

  // Gloo called directly: a context of its own, met through a file store on this host.
  const std::string store_dir =
      "/tmp/tandem-gloo-bench-" +
      cluster.addresses.front().substr(cluster.addresses.front().rfind(':') + 1);
  std::filesystem::create_directories(store_dir);
  gloo::rendezvous::FileStore store(store_dir);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto gloo_context = std::make_shared<gloo::rendezvous::Context>(cluster.rank, cluster.size);
  gloo_context->connectFullMesh(store, device);
  uint32_t tag = 0;
  auto barrier = [&] {
    gloo::BarrierOptions options(gloo_context);
    options.setTag(tag++);
    gloo::barrier(options);
  };

  if (chief)
    std::printf(
        "all-reduce across %d TF_CONFIG workers (1 CPU replica each), float32 sum, median of %d\n"
        "%10s %12s %12s %12s %12s %8s\n",
        strategy.num_workers(), samples, "bytes", "gloo_us", "tandem_us", "gloo_GB/s",
        "tandem_GB/s", "ratio");
  for (size_t bytes = static_cast<size_t>(min_kib) << 10;
       bytes <= static_cast<size_t>(max_mib) << 20; bytes *= 4) {
    const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    // One buffer for both paths (zeros stay zeros when summed).
    td::Tensor tandem_buffer = td::Tensor::zeros({n});
    float* gloo_buffer = tandem_buffer.data<float>();
    std::vector<td::Tensor> list = {tandem_buffer};
    const int calls = calls_for(bytes);
    std::vector<double> gloo_times, tandem_times;
    for (int s = 0; s < samples; ++s) {
      for (int pass = 0; pass < 2; ++pass) {
        const bool run_gloo = (s + pass) % 2 == 0;
        barrier();
        const double start = tb::now_seconds();
        for (int c = 0; c < calls; ++c) {
          if (run_gloo) {
            gloo::AllreduceOptions options(gloo_context);
            options.setOutput(gloo_buffer, static_cast<size_t>(n));
            options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
            options.setReduceFunction(
                static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
            options.setTag(tag++);
            gloo::allreduce(options);
          } else {
            comm.all_reduce(list, td::ReduceOp::kSum)->wait();
          }
        }
        const double per_call = (tb::now_seconds() - start) / calls;
        (run_gloo ? gloo_times : tandem_times).push_back(per_call);
      }
    }
    // Every process's median; the slowest process decides.
    std::vector<td::Tensor> medians = {
        td::Tensor::from_vector(std::vector<double>{median(gloo_times), median(tandem_times)})};
    comm.all_reduce(medians, td::ReduceOp::kMax)->wait();
    const std::vector<double> m = medians[0].to_vector<double>();
    if (chief)
      std::printf("%10zu %12.1f %12.1f %12.2f %12.2f %8.2f\n", bytes, m[0] * 1e6, m[1] * 1e6,
                  static_cast<double>(bytes) / m[0] / 1e9, static_cast<double>(bytes) / m[1] / 1e9,
                  m[0] / m[1]);
  }
  barrier();
  if (chief) {
    std::filesystem::remove_all(store_dir);
    std::printf(
        "\ntarget: ratio (Tandem / Gloo throughput) >= 0.9 at >= 16 MiB\n"
        "reproduce: tests/mpi/tf_config_workers.sh %d ./build/bench/bench_allreduce_gloo\n",
        strategy.num_workers());
  }
  return 0;
}
