// smoke: checks a Tandem build end to end. Prints what the build contains and which devices it
// sees, then fits a tiny softmax classifier with a GradientTape and plain gradient descent.
// Exits non-zero unless the loss falls. Usage: smoke [--steps N] [--seed S]
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;

namespace {

constexpr const char* kUsage = " (usage: smoke [--steps N] [--seed S])";

struct Options {
  int steps = 100;
  uint64_t seed = 42;
};

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "smoke: prints the build and the devices, then fits a tiny classifier\n"
                << "usage: smoke [--steps N] [--seed S]\n";
      std::exit(EXIT_SUCCESS);
    }
    TANDEM_CHECK(arg == "--steps" || arg == "--seed", "smoke: unknown argument ", arg, kUsage);
    TANDEM_CHECK(i + 1 < argc, "smoke: ", arg, " needs a value", kUsage);
    if (arg == "--steps") {
      options.steps = std::stoi(argv[++i]);
    } else {
      options.seed = std::stoull(argv[++i]);
    }
  }
  TANDEM_CHECK(options.steps > 0, "smoke: --steps must be positive, got ", options.steps);
  return options;
}

void print_build_and_devices() {
  const td::BuildInfo& info = td::build_info();
  auto mark = [](bool on) { return on ? "yes" : "no"; };
  std::cout << "Tandem " << info.version << "\n"
            << "  built with: CUDA " << mark(info.cuda) << ", NCCL " << mark(info.nccl)
            << ", oneDNN " << mark(info.onednn) << ", MPI " << mark(info.mpi) << ", HDF5 "
            << mark(info.hdf5) << "\n"
            << "  CPU cores: " << td::hardware_cores() << "\n";
  const td::CudaAvailability& cuda = td::cuda_availability();
  if (cuda.devices.empty()) {
    std::cout << "  GPUs: none (" << (cuda.reason.empty() ? "CUDA not built" : cuda.reason)
              << ")\n";
  }
  for (const td::CudaDeviceInfo& gpu : cuda.devices) {
    std::cout << "  " << td::Device::cuda(gpu.index) << ": " << gpu.name << ", sm_"
              << gpu.compute_capability_major << gpu.compute_capability_minor << ", "
              << gpu.total_memory_bytes / (1024 * 1024) << " MiB\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse_options(argc, argv);
    print_build_and_devices();

    // A toy problem with a known answer: 3 classes, label = the largest of 3 features.
    const int64_t num_examples = 256, num_features = 3, num_classes = 3;
    td::Generator generator(options.seed, /*stream=*/0);
    td::Tensor features = td::Tensor::normal({num_examples, num_features}, generator);
    td::Tensor labels = td::ops::argmax(features, /*axis=*/1);

    td::Variable kernel("dense/kernel",
                        td::Tensor::normal({num_features, num_classes}, generator, /*mean=*/0.0,
                                           /*stddev=*/0.1));
    td::Variable bias("dense/bias", td::Tensor::zeros({num_classes}));
    const std::vector<td::Variable> variables = {kernel, bias};
    const double learning_rate = 0.5;

    auto forward = [&] { return td::ops::matmul(features, kernel.value()) + bias.value(); };
    auto mean_loss = [&](const td::Tensor& logits) {
      return td::ops::mean(td::ops::sparse_softmax_cross_entropy(logits, labels));
    };
    auto accuracy = [&](const td::Tensor& logits) {
      td::Tensor hits = td::ops::equal(td::ops::argmax(logits, /*axis=*/1), labels);
      return td::ops::mean(td::ops::cast(hits, td::DType::kFloat32)).item<float>();
    };

    float first_loss = 0.0f;
    for (int step = 0; step < options.steps; ++step) {
      td::GradientTape tape;
      td::Tensor logits = forward();
      td::Tensor loss = mean_loss(logits);
      std::vector<td::Tensor> grads = tape.gradient(loss, variables);
      for (size_t i = 0; i < variables.size(); ++i) {
        variables[i].assign(variables[i].value_untracked() - grads[i] * learning_rate);
      }
      if (step == 0) first_loss = loss.item<float>();
      if (step == 0 || (step + 1) % 25 == 0) {
        std::cout << "step " << step + 1 << "/" << options.steps << "  loss " << loss.item<float>()
                  << "  accuracy " << accuracy(logits) << "\n";
      }
    }

    td::Tensor final_logits = forward();
    const float final_loss = mean_loss(final_logits).item<float>();
    if (!(final_loss < first_loss)) {
      std::cerr << "smoke: FAILED: the loss did not fall (" << first_loss << " -> " << final_loss
                << ")\n";
      return EXIT_FAILURE;
    }
    std::cout << "smoke: OK (loss " << first_loss << " -> " << final_loss << ", accuracy "
              << accuracy(final_logits) << ")\n";
    return EXIT_SUCCESS;
  } catch (const std::exception& error) {  // tandem::Error, or a bad number in the arguments
    std::cerr << "smoke: " << error.what() << "\n";
    return EXIT_FAILURE;
  }
}
