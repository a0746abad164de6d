// Training-step throughput on the CPU: the samples' models (the Fashion-MNIST MLP, CNN and
// ResNet) and a larger MLP, float32, Adam, written as a user's train step is (nn layers,
// GradientTape, apply_gradients inside strategy.run), against the GEMMs and convolutions the same
// step needs, run alone (for the ResNet: its batch normalizations alone).
// bench/peers/run times PyTorch, TensorFlow and JAX on the same configurations.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fashion_mnist_resnet/residual_block.h"
#include "shakespeare_gpt/gpt.h"
#include "tandem/tandem.h"
#include "timing.h"

namespace {

namespace td = tandem;

enum class Model { kMlp, kLargeMlp, kCnn, kResnet, kGpt, kGptLarge };

struct Config {
  std::string name;   ///< what --configs selects and the peers' scripts print
  std::string model;  ///< for the table
  Model kind;
  int64_t batch;  ///< global batch, split evenly across the replicas
  int replicas;
};

std::vector<Config> all_configs() {
  return {{"mlp-b64", "mlp 784-256-128-10", Model::kMlp, 64, 1},
          {"mlp-b256", "mlp 784-256-128-10", Model::kMlp, 256, 1},
          {"large-b256", "mlp 784-1024x2-10", Model::kLargeMlp, 256, 1},
          {"cnn-b64", "cnn (fashion_mnist_cnn)", Model::kCnn, 64, 1},
          {"resnet-b64", "resnet (fashion_mnist_resnet)", Model::kResnet, 64, 1},
          {"mlp-b64-r2", "mlp 784-256-128-10", Model::kMlp, 64, 2},
          {"mlp-b256-r2", "mlp 784-256-128-10", Model::kMlp, 256, 2},
          // samples/shakespeare_gpt's model; the batch counts sequences of the block's tokens.
          {"gpt-b12", "gpt 4x4x128, 64 tokens", Model::kGpt, 12, 1},
          {"gpt-b12-r2", "gpt 4x4x128, 64 tokens", Model::kGpt, 12, 2},
          {"gpt-large-b12", "gpt 6x6x384, 256 tokens", Model::kGptLarge, 12, 1}};
}

bool is_gpt(Model kind) { return kind == Model::kGpt || kind == Model::kGptLarge; }

/// nanoGPT's shakespeare_char recipes (CPU, and the larger one), on the corpus's 84 characters.
samples::gpt::Config gpt_config(Model kind) {
  if (kind == Model::kGptLarge)
    return {.vocabulary = 84, .block = 256, .layers = 6, .heads = 6, .embed = 384};
  return {.vocabulary = 84, .block = 64, .layers = 4, .heads = 4, .embed = 128};
}

/// The model each sample builds (samples/fashion_mnist_mlp, samples/fashion_mnist_cnn); the
/// large MLP is the sample MLP with two 1024-wide hidden layers.
td::nn::Sequential make_model(Model kind) {
  const td::nn::Activation relu = td::nn::Activation::kRelu;
  switch (kind) {
    case Model::kMlp:
      return td::nn::Sequential({td::nn::Flatten(), td::nn::Dense(256, relu),
                                 td::nn::Dense(128, relu), td::nn::Dense(10)});
    case Model::kLargeMlp:
      return td::nn::Sequential({td::nn::Flatten(), td::nn::Dense(1024, relu),
                                 td::nn::Dense(1024, relu), td::nn::Dense(10)});
    case Model::kCnn:
      return td::nn::Sequential(
          {td::nn::Conv2D(32, /*kernel_size=*/5, /*strides=*/1, td::nn::Padding::kSame, relu),
           td::nn::MaxPool2D(/*pool_size=*/2),
           td::nn::Conv2D(64, /*kernel_size=*/5, /*strides=*/1, td::nn::Padding::kSame, relu),
           td::nn::MaxPool2D(/*pool_size=*/2), td::nn::Flatten(), td::nn::Dense(1024, relu),
           td::nn::Dropout(0.4), td::nn::Dense(10)});
    case Model::kResnet:  // samples/fashion_mnist_resnet's make_model
      return td::nn::Sequential(
          {td::nn::Conv2D(16, 3, 1, td::nn::Padding::kSame, td::nn::Activation::kNone, false),
           td::nn::BatchNormalization(), td::nn::ActivationLayer(relu), samples::ResidualBlock(16),
           samples::ResidualBlock(32, 2), samples::ResidualBlock(64, 2),
           td::nn::GlobalAveragePooling2D(), td::nn::Dense(10)});
    case Model::kGpt:  // run_gpt_config builds it
    case Model::kGptLarge:
      break;
  }
  TANDEM_THROW("bench_step_cpu: unknown model");
}

td::Shape example_shape(Model kind) {
  return kind == Model::kCnn || kind == Model::kResnet ? td::Shape{28, 28, 1} : td::Shape{28, 28};
}

struct Gemm {
  bool transpose_a, transpose_b;
  int64_t m, n, k;
};

/// The GEMMs one replica's step cannot do without: per Dense layer Y = X W, dX = dY W^T and
/// dW = X^T dY. The model's first layer's input needs no gradient, so its dX is not counted
/// (the CNN's Dense layers are not first: their dX reaches the convolutions). The forward GEMMs
/// run as the fused dense op runs them without an epilogue (one oneDNN matmul), the backward
/// ones as ops::matmul.
std::vector<Gemm> step_gemms(Model kind, int64_t batch) {
  std::vector<Gemm> gemms;
  bool first = kind != Model::kCnn;
  auto layer = [&](int64_t rows, int64_t in, int64_t out) {
    gemms.push_back({false, false, rows, out, in});
    if (!first) gemms.push_back({false, true, rows, in, out});
    gemms.push_back({true, false, in, out, rows});
    first = false;
  };
  switch (kind) {
    case Model::kMlp:
      layer(batch, 784, 256), layer(batch, 256, 128), layer(batch, 128, 10);
      break;
    case Model::kLargeMlp:
      layer(batch, 784, 1024), layer(batch, 1024, 1024), layer(batch, 1024, 10);
      break;
    case Model::kCnn:
      layer(batch, 7 * 7 * 64, 1024), layer(batch, 1024, 10);
      break;
    case Model::kResnet:  // timed against its batch normalizations instead (step_batch_norms)
    case Model::kGpt:     // not split up
    case Model::kGptLarge:
      break;
  }
  return gemms;
}

struct Conv {
  td::Shape x, kernel;  // 5x5, stride 1, SAME
  bool first;           // no input gradient
};

/// The convolutions of the CNN's step: forward, backward-weights and, but for the first layer,
/// backward-data, as ops::conv2d runs them (float32: oneDNN's convolution primitives).
std::vector<Conv> step_convs(Model kind, int64_t batch) {
  if (kind != Model::kCnn) return {};
  return {{{batch, 28, 28, 1}, {5, 5, 1, 32}, true},      // 28x28x1 -> 28x28x32, pool -> 14x14
          {{batch, 14, 14, 32}, {5, 5, 32, 64}, false}};  // 14x14x32 -> 14x14x64, pool -> 7x7
}

/// The ResNet's batch normalizations: the input shape of each of its 9 layers (the stem and
/// block 1 at 28x28x16, blocks 2 and 3 with their shortcuts at 14x14x32 and 7x7x64).
std::vector<td::Shape> step_batch_norms(Model kind, int64_t batch) {
  if (kind != Model::kResnet) return {};
  std::vector<td::Shape> shapes;
  for (const auto& [side, channels] : {std::pair<int64_t, int64_t>{28, 16}, {14, 32}, {7, 64}})
    for (int i = 0; i < 3; ++i) shapes.push_back({batch, side, side, channels});
  return shapes;
}

struct Options {
  std::vector<std::string> configs;  // empty: all
  int warmup_steps = 10;
  int timed_steps = 60;  // the median is over these
  int threads = 0;       // compute threads per replica; 0: the strategy's (cores / replicas)
  bool csv = false;
  std::string precision = "float32";  // the dtype policy the model is made under
};

/// Median seconds of `fn` over `timed` calls after `warmup` calls, each call timed on its own.
double median_seconds(const std::function<void()>& fn, int warmup, int timed) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> seconds;
  for (int i = 0; i < timed; ++i) {
    const double start = td::bench::now_seconds();
    fn();
    seconds.push_back(td::bench::now_seconds() - start);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

struct Result {
  double step_seconds;  ///< median
  double gemm_seconds;  ///< median of the step's GEMMs and convolutions alone
  int threads;          ///< compute threads per replica
};

/// The GPT sample's step (its train_step, less the loss's reduction): AdamW (1e-3, beta_2 0.99,
/// decay 0.1 on matrices) with clipping at global norm 1.0, on random tokens.
Result run_gpt_config(const Config& c, const Options& options) {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(c.replicas);
  if (options.threads > 0)
    strategy.run([&](td::ReplicaContext&) { td::set_compute_threads(options.threads); });
  const td::PerReplica<int> threads =
      strategy.run([](td::ReplicaContext&) { return td::compute_threads(); });
  const samples::gpt::Config config = gpt_config(c.kind);
  const int64_t per_replica = c.batch / c.replicas;
  td::Generator generator(/*seed=*/1);
  std::vector<td::Tensor> xs, ys;
  for (int r = 0; r < c.replicas; ++r) {
    const td::Tensor tokens = td::ops::cast(
        td::Tensor::uniform({per_replica, config.block + 1}, generator, 0, 84, td::DType::kFloat64),
        td::DType::kInt64);
    xs.push_back(td::ops::slice(tokens, 1, 0, config.block));
    ys.push_back(td::ops::slice(tokens, 1, 1, config.block + 1));
  }
  const td::PerReplica<td::Tensor> x(xs), y(ys);
  td::nn::set_global_policy(options.precision);
  auto scope = strategy.scope();
  td::nn::Module model = samples::gpt::make_gpt(config);
  model.set_seed(42);
  model.build({config.block});
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::optim::AdamW optimizer(
      {.learning_rate = 1e-3, .weight_decay = 0.1, .beta_2 = 0.99, .global_clipnorm = 1.0});
  optimizer.exclude_from_weight_decay(samples::gpt::undecayed(model));
  optimizer.build(variables);
  auto train_step = [&](td::ReplicaContext& ctx, const td::Tensor& ids, const td::Tensor& next) {
    td::GradientTape tape;
    const td::Tensor loss = td::compute_average_loss(
        samples::gpt::sequence_losses(model(ids, /*training=*/true), next), c.batch);
    optimizer.apply_gradients(ctx, tape.gradient(loss, variables), variables);
    return loss;
  };
  const double step_seconds = median_seconds([&] { strategy.run(train_step, x, y); },
                                             options.warmup_steps, options.timed_steps);
  return {step_seconds, 0.0, threads[0]};
}

Result run_config(const Config& c, const Options& options) {
  if (is_gpt(c.kind)) return run_gpt_config(c, options);
  // OneDeviceStrategy would run on this thread; MirroredStrategy is what the samples use, and
  // its replicas run on their own threads, with one replica as with two.
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(c.replicas);
  if (options.threads > 0) {
    // Each replica thread keeps the compute-thread count it sets (threading.h).
    strategy.run([&](td::ReplicaContext&) { td::set_compute_threads(options.threads); });
  }
  const td::PerReplica<int> threads =
      strategy.run([](td::ReplicaContext&) { return td::compute_threads(); });

  const int64_t per_replica = c.batch / c.replicas;
  td::Generator generator(/*seed=*/1);
  std::vector<td::Tensor> features, labels;
  td::Shape shape = example_shape(c.kind);
  shape.dims().insert(shape.dims().begin(), per_replica);
  for (int r = 0; r < c.replicas; ++r) {
    features.push_back(td::Tensor::uniform(shape, generator, 0, 1));
    labels.push_back(
        td::ops::cast(td::Tensor::uniform({per_replica}, generator, 0, 10, td::DType::kFloat64),
                      td::DType::kInt64));
  }
  const td::PerReplica<td::Tensor> replica_features(features), replica_labels(labels);

  td::nn::set_global_policy(options.precision);
  auto scope = strategy.scope();  // mirrored weights and slots, as in the samples
  td::nn::Sequential model = make_model(c.kind);
  model.set_seed(42);
  model.build(example_shape(c.kind));
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::optim::Adam optimizer(
      {.learning_rate = 1e-3, .beta_1 = 0.9, .beta_2 = 0.999, .epsilon = 1e-7});
  optimizer.build(variables);
  const td::losses::SparseCategoricalCrossentropy loss_fn(
      {.from_logits = true, .reduction = td::losses::Reduction::kNone});

  // The samples' train step, less their metrics.
  auto train_step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
    td::GradientTape tape;
    const td::Tensor logits = model(x, /*training=*/true);
    const td::Tensor loss = td::compute_average_loss(loss_fn(y, logits), c.batch);
    const std::vector<td::Tensor> grads = tape.gradient(loss, variables);
    optimizer.apply_gradients(ctx, grads, variables);  // SUM across replicas
    return loss;
  };
  const double step_seconds =
      median_seconds([&] { strategy.run(train_step, replica_features, replica_labels); },
                     options.warmup_steps, options.timed_steps);

  // The same GEMMs and convolutions on every replica at once, on the replica threads, timed the
  // same way.
  const std::vector<Gemm> gemms = step_gemms(c.kind, per_replica);
  const std::vector<Conv> convs = step_convs(c.kind, per_replica);
  // In the policy's compute dtype, as the layers run them.
  const td::DType compute = td::nn::Policy(options.precision).compute_dtype();
  const auto operand = [&](const td::Shape& shape) {
    return td::ops::cast(td::Tensor::uniform(shape, generator, -1, 1), compute);
  };
  std::vector<std::vector<td::Tensor>> a(c.replicas), b(c.replicas);
  for (int r = 0; r < c.replicas; ++r) {
    for (const Gemm& g : gemms) {
      a[r].push_back(operand(g.transpose_a ? td::Shape{g.k, g.m} : td::Shape{g.m, g.k}));
      b[r].push_back(operand(g.transpose_b ? td::Shape{g.n, g.k} : td::Shape{g.k, g.n}));
    }
    for (const Conv& conv : convs) {
      a[r].push_back(operand(conv.x));
      b[r].push_back(operand(conv.kernel));
    }
  }
  auto gemm_pass = [&](td::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    for (size_t i = 0; i < gemms.size(); ++i) {
      const Gemm& g = gemms[i];
      if (!g.transpose_a && !g.transpose_b)
        td::ops::dense(a[r][i], b[r][i]);
      else
        td::ops::matmul(a[r][i], b[r][i], g.transpose_a, g.transpose_b);
    }
    for (size_t i = 0; i < convs.size(); ++i) {
      const td::Tensor& x = a[r][gemms.size() + i];
      const td::Tensor& kernel = b[r][gemms.size() + i];
      // The backward through a tape, whose only other work is seeding the output gradient.
      td::GradientTape tape;
      tape.watch(kernel);
      if (!convs[i].first) tape.watch(x);
      const td::Tensor y = td::ops::conv2d(x, kernel, {1, 1}, td::ops::Padding::kSame);
      tape.gradient(
          y, convs[i].first ? std::vector<td::Tensor>{kernel} : std::vector<td::Tensor>{x, kernel});
    }
  };
  // The ResNet's batch normalizations, forward in training mode and backward to their input,
  // gamma and beta, on every replica at once.
  const std::vector<td::Shape> norms = step_batch_norms(c.kind, per_replica);
  std::vector<std::vector<td::nn::BatchNormalization>> norm_layers(c.replicas);
  std::vector<std::vector<td::Tensor>> norm_inputs(c.replicas);
  for (int r = 0; r < c.replicas && !norms.empty(); ++r) {
    for (const td::Shape& shape : norms) {
      td::nn::BatchNormalization bn;
      bn.build({shape[1], shape[2], shape[3]});
      norm_layers[r].push_back(bn);
      norm_inputs[r].push_back(operand(shape));
    }
  }
  auto norm_pass = [&](td::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    for (size_t i = 0; i < norms.size(); ++i) {
      td::nn::BatchNormalization& bn = norm_layers[r][i];
      const td::Tensor& x = norm_inputs[r][i];
      td::GradientTape tape;
      tape.watch(x);
      const td::Tensor y = bn(x, /*training=*/true);
      std::vector<td::Tensor> sources{x};
      for (const td::Variable& v : bn.trainable_variables()) sources.push_back(v.value());
      tape.gradient(y, sources);
    }
  };
  const double gemm_seconds = norms.empty()
                                  ? median_seconds([&] { strategy.run(gemm_pass); },
                                                   options.warmup_steps, options.timed_steps)
                                  : median_seconds([&] { strategy.run(norm_pass); },
                                                   options.warmup_steps, options.timed_steps);
  return {step_seconds, gemm_seconds, threads[0]};
}

[[noreturn]] void usage(const char* program, int code) {
  std::printf(
      "usage: %s [--configs NAME,...] [--steps N] [--warmup N] [--threads N] [--precision P] "
      "[--csv]\n"
      "  --configs  subset of: ",
      program);
  for (const Config& c : all_configs()) std::printf("%s ", c.name.c_str());
  std::printf(
      "\n  --steps    timed steps per configuration (default 60; the median is reported)\n"
      "  --warmup   untimed steps before them (default 10)\n"
      "  --threads  compute threads per replica (default: cores / replicas)\n"
      "  --precision  float32 (default), mixed_bfloat16 or mixed_float16: the model's dtype\n"
      "             policy (float32 weights and Adam; the GEMMs alone in the compute dtype)\n"
      "  --csv      one line per configuration: "
      "config,replicas,batch,threads,samples_per_s,ms_per_step,gemm_ms,gemm_fraction\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], 2);
      return argv[++i];
    };
    if (arg == "--configs") {
      std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        if (comma > start) options.configs.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (arg == "--steps") {
      options.timed_steps = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--warmup") {
      options.warmup_steps = std::max(0, std::atoi(value().c_str()));
    } else if (arg == "--threads") {
      options.threads = std::max(0, std::atoi(value().c_str()));
    } else if (arg == "--precision") {
      options.precision = value();
      if (options.precision != "float32" && options.precision != "mixed_bfloat16" &&
          options.precision != "mixed_float16")
        usage(argv[0], 2);
    } else if (arg == "--csv") {
      options.csv = true;
    } else if (arg == "--help" || arg == "-h") {
      usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "bench_step_cpu: unknown argument '%s'\n", arg.c_str());
      usage(argv[0], 2);
    }
  }
  for (const std::string& name : options.configs) {
    const std::vector<Config> configs = all_configs();
    if (std::none_of(configs.begin(), configs.end(),
                     [&](const Config& c) { return c.name == name; })) {
      std::fprintf(stderr, "bench_step_cpu: unknown configuration '%s'\n", name.c_str());
      usage(argv[0], 2);
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::vector<Config> configs;
  for (const Config& c : all_configs()) {
    if (options.configs.empty() ||
        std::find(options.configs.begin(), options.configs.end(), c.name) != options.configs.end())
      configs.push_back(c);
  }
  td::bench::BackgroundLoad load;
  if (options.csv) {
    std::printf("config,replicas,batch,threads,samples_per_s,ms_per_step,gemm_ms,gemm_fraction\n");
  } else {
    std::printf(
        "Tandem training step on the CPU (%d cores), dtype policy %s, Adam (lr 1e-3, beta "
        "0.9/0.999, eps 1e-7), synthetic data; median of %d steps after %d\n",
        td::hardware_cores(), options.precision.c_str(), options.timed_steps, options.warmup_steps);
    std::printf(
        "step = strategy.run(forward + cross-entropy + backward + apply_gradients); gemm = the "
        "GEMMs and convolutions the step needs, alone (dense forward as one oneDNN matmul, "
        "backward through ops::matmul; convolutions forward and backward as ops::conv2d runs "
        "them; no input gradient for the first layer); of_gemm = gemm_ms / step_ms; for the "
        "resnet, gemm_ms is its 9 batch normalizations alone (forward in training mode and "
        "backward) and of_gemm their share of the step\n\n");
    std::printf("%-12s %-24s %6s %8s %8s %12s %9s %9s %8s %9s\n", "config", "model", "batch",
                "replicas", "threads", "samples/s", "step_ms", "gemm_ms", "of_gemm", "vs_1rep");
  }
  double one_replica_samples_per_s[2] = {0, 0};  // sample MLP, batch 64 and 256
  for (const Config& c : configs) {
    const Result r = run_config(c, options);
    const double samples_per_s = static_cast<double>(c.batch) / r.step_seconds;
    const double fraction = r.gemm_seconds / r.step_seconds;
    if (options.csv) {
      std::printf("%s,%d,%lld,%d,%.1f,%.4f,%.4f,%.4f\n", c.name.c_str(), c.replicas,
                  static_cast<long long>(c.batch), r.threads, samples_per_s, r.step_seconds * 1e3,
                  r.gemm_seconds * 1e3, fraction);
    } else {
      // Two replicas against one on the same global batch, when both rows ran.
      char versus[16] = "-";
      if (c.kind == Model::kMlp) {
        double& one = one_replica_samples_per_s[c.batch == 64 ? 0 : 1];
        if (c.replicas == 1) one = samples_per_s;
        if (c.replicas == 2 && one > 0)
          std::snprintf(versus, sizeof(versus), "%.2fx", samples_per_s / one);
      }
      std::printf("%-12s %-24s %6lld %8d %8d %12.0f %9.3f %9.3f %8.2f %9s\n", c.name.c_str(),
                  c.model.c_str(), static_cast<long long>(c.batch), c.replicas, r.threads,
                  samples_per_s, r.step_seconds * 1e3, r.gemm_seconds * 1e3, fraction, versus);
    }
    std::fflush(stdout);
  }
  if (!options.csv) {
    std::printf("\nbackground load: %.2f cores used by other processes during the run%s\n",
                load.cores(), load.cores() > 0.1 ? " (figures are indicative)" : "");
    std::printf("compare: bench/peers/run (PyTorch, TensorFlow, JAX on the same configurations)\n");
    std::printf("reproduce: %s\n",
                td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  }
  return 0;
}
