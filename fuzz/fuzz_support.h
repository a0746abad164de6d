// Shared by the fuzz harnesses: a per-process scratch directory that the fuzz input is written
// into (Tandem's readers take paths), the rule for which exceptions are expected outcomes, and
// the small training state whose checkpoints fuzz_checkpoint_restore restores (make_seeds
// writes the seed checkpoints from the same state, so their model signature matches).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::fuzzing {

/// A directory of this process (libFuzzer's -fork/-jobs workers each get their own), removed at
/// exit. Under $TMPDIR, else /tmp.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/tandem_fuzz_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("tandem fuzz: mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// The process's scratch directory (a function-local static: destroyed at normal exit).
inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

/// Replaces `path` with the bytes [data, data + size).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "tandem fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

/// Quiets Tandem's logging (a restore that falls back logs a warning per input); a
/// TANDEM_LOG_LEVEL set by the caller wins. Call from LLVMFuzzerInitialize, before any log.
inline void quiet_logging() {
  ::setenv("TANDEM_LOG_LEVEL", "error", /*overwrite=*/0);
  // A damaged file that makes libhdf5 loop ends the child reading its strings after 1 s, not
  // 10: the harnesses keep their pace.
  ::setenv("TANDEM_HDF5_READ_TIMEOUT", "1", /*overwrite=*/0);
}

/// Defines libFuzzer's LLVMFuzzerInitialize as quiet_logging() (at file scope of a harness).
#define TANDEM_FUZZ_QUIET_INITIALIZE()                 \
  extern "C" int LLVMFuzzerInitialize(int*, char***) { \
    ::tandem::fuzzing::quiet_logging();                \
    return 0;                                          \
  }

/// Runs `body` on one input. tandem::Error (bad input, reported with a message) and the other
/// std::exceptions Tandem lets through for bad input (std::out_of_range from a parse, a
/// std::filesystem_error) are expected outcomes. std::bad_alloc and std::length_error are not:
/// they mean a size read from the file reached an allocation unchecked, so the harness aborts
/// (a finding; libFuzzer's -malloc_limit_mb catches the allocations that would succeed).
/// TANDEM_FUZZ_VERBOSE=1 prints each expected error (to see why a seed is refused).
template <typename Body>
void run_expecting_errors(Body&& body) {
  static const bool verbose = std::getenv("TANDEM_FUZZ_VERBOSE") != nullptr;
  try {
    body();
    if (verbose) std::fprintf(stderr, "tandem fuzz: accepted\n");
  } catch (const Error& e) {
    if (verbose) std::fprintf(stderr, "tandem fuzz: tandem::Error: %s\n", e.what());
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr, "tandem fuzz: FINDING: std::bad_alloc escaped: %s\n", e.what());
    std::abort();
  } catch (const std::length_error& e) {
    std::fprintf(stderr, "tandem fuzz: FINDING: std::length_error escaped: %s\n", e.what());
    std::abort();
  } catch (const std::exception& e) {
    if (verbose) std::fprintf(stderr, "tandem fuzz: std::exception: %s\n", e.what());
  }
}

// ---- the training state of fuzz_checkpoint_restore --------------------------------------------

/// A tiny version of samples/fashion_mnist_mlp's state: an MLP trained by Adam on 2 CPU
/// replicas, its shuffled, batched, prefetched distributed dataset, a loss mean and an accuracy
/// metric and the step_in_epoch counter, all tracked by one Checkpoint under the sample's names.
struct TrainingState {
  static constexpr int64_t kFeatures = 6;
  static constexpr int64_t kClasses = 3;
  static constexpr int64_t kExamples = 20;
  static constexpr int64_t kGlobalBatch = 4;
  static constexpr int kReplicas = 2;

  TrainingState()
      : strategy(MirroredStrategy::cpu(kReplicas)),
        train_data(strategy.distribute_dataset(make_dataset())),
        train_loss("train_loss"),
        train_accuracy("train_accuracy") {
    auto scope = strategy.scope();
    model = std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
        nn::Dense(8, nn::Activation::kRelu), nn::Dropout(0.25), nn::Dense(kClasses)});
    model->set_seed(7);
    model->build({kFeatures});
    optimizer = std::make_unique<optim::Adam>(optim::Adam::Options{.learning_rate = 0.01});
    optimizer->build(model->trainable_variables());
  }

  static data::Dataset make_dataset() {
    Generator g(/*seed=*/2024);
    const Tensor features = Tensor::normal({kExamples, kFeatures}, g);
    std::vector<int64_t> labels(static_cast<size_t>(kExamples));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % kClasses);
    return data::from_tensor_slices({features, Tensor::from_vector(labels)})
        .shuffle(/*buffer_size=*/8, /*seed=*/42)
        .batch(kGlobalBatch)
        .prefetch(2);
  }

  Checkpoint checkpoint() {
    return Checkpoint({{"model", model.get()},
                       {"optimizer", optimizer.get()},
                       {"train_data", &train_data},
                       {"train_loss", &train_loss},
                       {"train_accuracy", &train_accuracy},
                       {"step_in_epoch", &step_in_epoch}});
  }

  /// `steps` training steps, crossing epoch boundaries as needed (make_seeds trains so that the
  /// slots, metrics and data position it saves are not initial values; the restore harness
  /// trains one step from what it restored).
  void train(int64_t steps) {
    const std::vector<Variable> variables = model->trainable_variables();
    auto step = [&](ReplicaContext& ctx, const data::Batch& batch) {
      GradientTape tape;
      const Tensor logits = (*model)(batch.features(), /*training=*/true);
      const Tensor per_example =
          losses::sparse_categorical_crossentropy(batch.labels(), logits, /*from_logits=*/true);
      const Tensor loss = compute_average_loss(per_example, kGlobalBatch);
      optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
      train_loss.update_state(per_example);
      train_accuracy.update_state(batch.labels(), logits);
      return loss;
    };
    std::vector<data::Batch> batches;
    for (int64_t s = 0; s < steps; ++s) {
      if (!train_data.next(batches)) {
        step_in_epoch = 0;  // the next call starts the next epoch
        if (!train_data.next(batches)) throw Error("fuzz: the training dataset is empty");
      }
      strategy.run(step, PerReplica<data::Batch>(batches));
      ++step_in_epoch;
    }
  }

  MirroredStrategy strategy;
  data::DistributedDataset train_data;
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Adam> optimizer;
  metrics::Mean train_loss;
  metrics::SparseCategoricalAccuracy train_accuracy;
  int64_t step_in_epoch = 0;
};

}  // namespace tandem::fuzzing
