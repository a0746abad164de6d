// Helpers shared by the interop tests (test_interop.cpp, test_keras_*.cpp): the scripts' folder,
// the sample MLP, running a command, and finding Fashion-MNIST and a Python that has TensorFlow
// (or saying the test is skipped).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"

namespace tandem::checkpoint_testing {

/// tests/interop: the Python scripts the interop tests run.
inline const std::string kInteropDir = std::string(TANDEM_SOURCE_DIR) + "/tests/interop";

/// The sample MLP: Flatten, Dense(256, relu), Dense(128, relu), Dense(10) on 28x28 images.
inline nn::Sequential sample_mlp(uint64_t seed = 42) {
  nn::Sequential model({nn::Flatten(), nn::Dense(256, nn::Activation::kRelu),
                        nn::Dense(128, nn::Activation::kRelu), nn::Dense(10)});
  model.set_seed(seed);
  model.build({28, 28});
  return model;
}

/// The raw values of a binary file the interop scripts wrote (numpy's tofile), as T.
template <typename T>
std::vector<T> read_values(const std::string& path) {
  const std::string bytes = read_text(path);
  REQUIRE(bytes.size() % sizeof(T) == 0);
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

/// Runs `command`; returns its exit status (-1 when it did not exit normally).
inline int shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// A Python interpreter that has TensorFlow: $TANDEM_TF_PYTHON, /opt/tf-venv/bin/python or
/// python3; "" when none has.
inline std::string tensorflow_python() {
  std::vector<std::string> candidates;
  if (const std::string chosen = env_or_empty("TANDEM_TF_PYTHON"); !chosen.empty())
    candidates.push_back(chosen);
  candidates.push_back("/opt/tf-venv/bin/python");
  candidates.push_back("python3");
  for (const std::string& python : candidates) {
    if (python.starts_with("/") && !fs::exists(python)) continue;
    // find_spec locates the package without importing it (importing TensorFlow takes seconds).
    const std::string probe =
        " -c 'import importlib.util, sys; "
        "sys.exit(0 if importlib.util.find_spec(\"tensorflow\") else 1)' >/dev/null 2>&1";
    if (shell(python + probe) == 0) return python;
  }
  return "";
}

/// Fashion-MNIST's directory when `file` (e.g. "t10k-images-idx3-ubyte.gz") is in it; else ""
/// after warning that the calling test is skipped.
inline std::string fashion_mnist_or_skip(const std::string& file) {
  const std::string directory = data::kFashionMnistDirectory;
  if (fs::exists(directory + "/" + file)) return directory;
  WARN("Fashion-MNIST is not installed in " << directory << "; skipped");
  return "";
}

/// tensorflow_python(); when there is none, "" after warning that the calling test is skipped.
inline std::string tensorflow_python_or_skip() {
  std::string python = tensorflow_python();
  if (python.empty())
    WARN("TensorFlow is not installed (set TANDEM_TF_PYTHON to a Python that has it); skipped");
  return python;
}

}  // namespace tandem::checkpoint_testing
