// Throughput of the Fashion-MNIST input pipeline (shuffle over the whole training set, batch,
// prefetch): batches/s and samples/s over whole epochs, with and without prefetch, and the
// cost of saving and restoring the iterator mid-epoch (what a checkpoint pays).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace {

namespace td = tandem;
namespace data = tandem::data;

struct Row {
  int64_t batch_size;
  int64_t prefetch;  // 0: none
  double epoch_seconds;
  double cpu_seconds;  // CPU time of the whole process (both threads) per epoch
  int64_t batches;
  int64_t samples;
};

/// CPU time of this process, all threads: robust to other processes competing for the cores.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

data::Dataset pipeline(const std::string& directory, int64_t batch_size, int64_t prefetch) {
  data::Dataset ds = data::fashion_mnist(data::Split::kTrain, directory)
                         .shuffle(/*buffer_size=*/60000, /*seed=*/42)
                         .batch(batch_size);
  return prefetch > 0 ? ds.prefetch(prefetch) : ds;
}

/// Median seconds of one training step of the sample MLP (784-256-128-10, Adam, one replica,
/// forward + backward + update) at `batch_size`: the rate the pipeline must outpace.
double mlp_step_seconds(int64_t batch_size) {
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(256, td::nn::Activation::kRelu),
                            td::nn::Dense(128, td::nn::Activation::kRelu), td::nn::Dense(10)});
  model.build({28, 28});
  td::optim::Adam optimizer({.learning_rate = 1e-3});
  td::losses::SparseCategoricalCrossentropy loss_fn(
      {.from_logits = true, .reduction = td::losses::Reduction::kNone});
  td::Generator generator(/*seed=*/1, /*stream=*/0);
  const td::Tensor x = td::Tensor::uniform({batch_size, 28, 28}, generator);
  std::vector<int64_t> labels(static_cast<size_t>(batch_size));
  for (auto& label : labels) label = static_cast<int64_t>(generator.uniform_int(10));
  const td::Tensor y = td::Tensor::from_vector(labels);
  std::vector<double> seconds;
  for (int step = 0; step < 60; ++step) {
    const double start = td::bench::now_seconds();
    td::GradientTape tape;
    const td::Tensor logits = model(x, /*training=*/true);
    const td::Tensor loss = td::compute_average_loss(loss_fn(y, logits), batch_size);
    const auto grads = tape.gradient(loss, model.trainable_variables());
    optimizer.apply_gradients(grads, model.trainable_variables());
    if (step >= 10) seconds.push_back(td::bench::now_seconds() - start);  // after warm-up
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

/// Median over `epochs` whole epochs (each a new iterator, so each reshuffles and refills
/// the 60000-element shuffle buffer, as a training loop does).
Row measure(const std::string& directory, int64_t batch_size, int64_t prefetch, int epochs) {
  const data::Dataset ds = pipeline(directory, batch_size, prefetch);
  std::vector<double> seconds, cpu_seconds;
  Row row{batch_size, prefetch, 0, 0, 0, 0};
  for (int epoch = 0; epoch < epochs; ++epoch) {
    data::Iterator it = ds.iterator(static_cast<uint64_t>(epoch));
    data::Element batch;
    int64_t batches = 0, samples = 0;
    double checksum = 0;  // touch each batch as a consumer would
    const double start = td::bench::now_seconds();
    const double cpu_start = process_cpu_seconds();
    while (it.next(batch)) {
      ++batches;
      samples += batch[0].dim(0);
      checksum += static_cast<double>(batch[0].data<float>()[0]) +
                  static_cast<double>(batch[1].data<int64_t>()[0]);
    }
    seconds.push_back(td::bench::now_seconds() - start);
    cpu_seconds.push_back(process_cpu_seconds() - cpu_start);
    TANDEM_CHECK(samples == 60000 && checksum >= 0, "bench_input_pipeline: an epoch delivered ",
                 samples, " samples, not 60000");
    row.batches = batches;
    row.samples = samples;
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  row.epoch_seconds = seconds[seconds.size() / 2];
  std::nth_element(cpu_seconds.begin(), cpu_seconds.begin() + cpu_seconds.size() / 2,
                   cpu_seconds.end());
  row.cpu_seconds = cpu_seconds[cpu_seconds.size() / 2];
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::string directory = data::kFashionMnistDirectory;
  int epochs = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--epochs") == 0 && i + 1 < argc) {
      epochs = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--directory") == 0 && i + 1 < argc) {
      directory = argv[++i];
    } else {
      std::printf("usage: %s [--epochs N (default 3)] [--directory DIR (default %s)]\n", argv[0],
                  data::kFashionMnistDirectory);
      return 2;
    }
  }
  if (!std::filesystem::exists(directory)) {
    std::printf("Fashion-MNIST not found in %s: apt install dataset-fashion-mnist\n",
                directory.c_str());
    return 1;
  }
  td::bench::BackgroundLoad load;

  // The first use reads and decompresses the split; later datasets share it in memory.
  const double load_start = td::bench::now_seconds();
  const data::Dataset train = data::fashion_mnist(data::Split::kTrain, directory);
  const double load_seconds = td::bench::now_seconds() - load_start;

  std::vector<Row> rows;
  for (int64_t batch_size : {64, 256})
    for (int64_t prefetch : {2, 0})
      rows.push_back(measure(directory, batch_size, prefetch, epochs));

  // Checkpoint cost: save mid-epoch (the prefetch recomputes the consumer's position) and
  // restore into a new iterator.
  const data::Dataset ds = pipeline(directory, 256, 2);
  data::Iterator it = ds.iterator(0);
  data::Element batch;
  for (int i = 0; i < 100; ++i) it.next(batch);
  double start = td::bench::now_seconds();
  const data::IteratorState state = it.save();
  const double save_ms = (td::bench::now_seconds() - start) * 1e3;
  data::Iterator resumed = ds.iterator(5);
  start = td::bench::now_seconds();
  resumed.restore(state);
  const double restore_ms = (td::bench::now_seconds() - start) * 1e3;

  std::printf("Fashion-MNIST input pipeline, one epoch of 60000 examples (median of %d epochs)\n",
              epochs);
  std::printf("pipeline: fashion_mnist(train).shuffle(60000, seed=42).batch(B)[.prefetch(2)]\n");
  std::printf("first load of the split (gunzip + parse, once per process): %.2f s\n\n",
              load_seconds);
  std::printf(
      "| batch | prefetch | batches/s | samples/s | epoch (s) | CPU s/epoch | batches/CPU-s |\n");
  std::printf(
      "|------:|---------:|----------:|----------:|----------:|------------:|--------------:|\n");
  for (const Row& r : rows) {
    std::printf("| %5lld | %8s | %9.0f | %9.0f | %9.3f | %11.3f | %13.0f |\n",
                static_cast<long long>(r.batch_size),
                r.prefetch > 0 ? std::to_string(r.prefetch).c_str() : "none",
                static_cast<double>(r.batches) / r.epoch_seconds,
                static_cast<double>(r.samples) / r.epoch_seconds, r.epoch_seconds, r.cpu_seconds,
                static_cast<double>(r.batches) / r.cpu_seconds);
  }
  std::printf(
      "\nbatches/s, samples/s: wall clock, delivered to a consumer that does no work (in\n"
      "training, the prefetch thread overlaps the step). CPU s/epoch: CPU time of both\n"
      "threads, what the pipeline costs a training run's cores; trust it over the wall\n"
      "clock when other processes load the machine.\n");
  std::printf(
      "\nRequirement: the pipeline delivers batches >= 5x faster than the sample MLP trains\n"
      "on them (one CPU replica, all cores, Adam; median of 50 steps):\n\n");
  std::printf("| batch | MLP steps/s | pipeline batches/s (prefetch 2) | ratio | >= 5x |\n");
  std::printf("|------:|------------:|--------------------------------:|------:|:-----:|\n");
  for (const Row& r : rows) {
    if (r.prefetch != 2) continue;
    const double steps_per_second = 1.0 / mlp_step_seconds(r.batch_size);
    const double batches_per_second = static_cast<double>(r.batches) / r.epoch_seconds;
    const double ratio = batches_per_second / steps_per_second;
    std::printf("| %5lld | %11.0f | %31.0f | %5.1f | %5s |\n", static_cast<long long>(r.batch_size),
                steps_per_second, batches_per_second, ratio, ratio >= 5.0 ? "yes" : "NO");
  }
  std::printf(
      "\niterator state after 100 batches of 256: %zu int64 values in %zu arrays; "
      "save %.2f ms, restore %.2f ms\n",
      state.num_values(), state.entries().size(), save_ms, restore_ms);
  std::printf("background load from other processes: %.2f cores%s\n", load.cores(),
              load.cores() > 0.1 ? " (high: distrust the timings)" : "");
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  (void)train;
  return 0;
}
