// Strategy choice, setup line and distributed evaluation for the samples.
#include "common/training.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

namespace samples {

std::unique_ptr<tandem::Strategy> make_strategy(const Flags& flags) {
  const tandem::ClusterSpec cluster = tandem::ClusterResolver::from_environment();
  std::unique_ptr<tandem::Strategy> strategy;
  if (cluster.size > 1) {
    // Started by mpirun or srun, or from TF_CONFIG: every process is a worker; --replicas CPU
    // replicas each.
    std::vector<tandem::Device> local;
    for (int i = 0; i < flags.replicas.value_or(1); ++i) local.push_back(tandem::Device::cpu(i));
    strategy = std::make_unique<tandem::MultiWorkerMirroredStrategy>(local);
  } else if (!flags.devices.empty()) {
    strategy = std::make_unique<tandem::MirroredStrategy>(flags.devices);
  } else if (flags.replicas) {
    std::vector<tandem::Device> cpus;
    for (int i = 0; i < *flags.replicas; ++i) cpus.push_back(tandem::Device::cpu(i));
    strategy = std::make_unique<tandem::MirroredStrategy>(cpus);
  } else {
    strategy = tandem::make_strategy();
  }
  if (flags.bucket_mib) {
    tandem::CommunicationOptions options = strategy->communication_options();
    options.bytes_per_pack = int64_t{*flags.bucket_mib} << 20;
    options.first_bytes_per_pack = std::min(int64_t{1} << 20, options.bytes_per_pack);
    strategy->set_communication_options(options);
  }
  if (flags.gradient_compression != "none") {
    tandem::CommunicationOptions options = strategy->communication_options();
    options.gradient_compression = flags.gradient_compression == "bfloat16"
                                       ? tandem::GradientCompression::kBFloat16
                                       : tandem::GradientCompression::kFloat16;
    strategy->set_communication_options(options);
  }
  // The chief alone reports; the other workers train silently (errors still reach stderr).
  if (!strategy->is_chief()) std::cout.setstate(std::ios::failbit);
  if (flags.gradient_compression != "none" && strategy->num_replicas_in_sync() > 1)
    std::cout << "gradients travel between replicas as " << flags.gradient_compression
              << " (summed in float32)\n";
  return strategy;
}

std::unique_ptr<tandem::profile::Profiler> make_profiler(
    const Flags& flags, const tandem::Strategy& strategy, const TensorBoardLog& tensorboard,
    const tandem::optim::Optimizer* optimizer) {
  const char* environment = std::getenv("TANDEM_PROFILE");
  std::string trace = flags.profile;
  if (trace.empty() && environment != nullptr) trace = environment;
  if (trace.empty() && !tensorboard.writer()) return nullptr;
  // With only --tensorboard the breakdown goes to TensorBoard, not to the terminal. The sample
  // writes it there (TensorBoardLog::write_profile) once the epoch's checkpoint is saved.
  return std::make_unique<tandem::profile::Profiler>(
      strategy, tandem::profile::ProfilerOptions{.trace_file = trace,
                                                 .print_summaries = !trace.empty(),
                                                 .tensorboard = nullptr,
                                                 .tensorboard_step = {},
                                                 .optimizer = optimizer});
}

void set_precision(const Flags& flags) {
  const tandem::nn::Policy policy(flags.precision);
  tandem::nn::set_global_policy(policy);
  if (policy.is_mixed())
    std::cout << "precision " << policy.name() << ": " << policy.variable_dtype() << " variables, "
              << policy.compute_dtype() << " computation, float32 loss" << std::endl;
}

void print_setup(const SampleInfo& info, const tandem::Strategy& strategy, int64_t global_batch,
                 double learning_rate, int accumulation_steps) {
  const int replicas = strategy.num_replicas_in_sync();
  const int cores = tandem::hardware_cores();
  std::cout << info.name << ": " << replicas << " replica" << (replicas == 1 ? "" : "s") << " (";
  for (size_t i = 0; i < strategy.devices().size(); ++i) {
    std::cout << (i ? ", " : "") << strategy.devices()[i];
  }
  // The strategy gives each replica thread max(1, cores / replicas) compute threads.
  std::cout << "; " << cores << " CPU core" << (cores == 1 ? "" : "s") << ", "
            << std::max(1, cores / replicas) << " compute thread(s) per replica), global batch "
            << global_batch << " = " << replicas << " x " << global_batch / replicas
            << ", learning rate " << learning_rate << std::endl;
  if (accumulation_steps > 1) {
    std::cout << "gradient accumulation: " << accumulation_steps
              << " steps per update, effective batch " << global_batch * accumulation_steps << " = "
              << replicas << " x " << global_batch / replicas << " x " << accumulation_steps
              << " (one all-reduce per update)" << std::endl;
  }
}

void print_start(const std::optional<std::string>& restored, bool checkpointing, const Flags& flags,
                 uint64_t epoch, int64_t step) {
  if (!checkpointing) {
    std::cout << "checkpoints: off (Tandem was built without HDF5)" << std::endl;
  } else if (restored) {
    std::cout << "resumed from " << *restored << " (epoch " << epoch + 1 << ", step " << step
              << "); saving to " << flags.checkpoint_dir << " every epoch" << std::endl;
  } else {
    std::cout << (flags.fresh ? "--fresh: not restoring" : "no checkpoint to resume")
              << "; saving to " << flags.checkpoint_dir << " every epoch" << std::endl;
  }
  if (static_cast<int64_t>(epoch) >= flags.epochs) {
    std::cout << "all " << flags.epochs << " epochs are trained already (raise --epochs to train "
              << "more, or pass --fresh to start over)" << std::endl;
  }
}

int64_t eval_batch(const tandem::Strategy& strategy) {
  const int64_t workers = strategy.num_workers();
  return (kEvalBatch + workers - 1) / workers * workers;
}

int64_t examples_in(const tandem::PerReplica<tandem::data::Batch>& batch) {
  int64_t examples = 0;
  for (const tandem::data::Batch& piece : batch) examples += piece.batch_size();
  return examples;
}

int64_t steps_per_epoch(const tandem::data::DistributedDataset& train_data, const Flags& flags) {
  const int64_t steps = train_data.dataset().cardinality();
  if (steps < 0) return flags.max_steps.value_or(0);  // infinite or unknown
  return flags.max_steps ? std::min(steps, *flags.max_steps) : steps;
}

double evaluate(tandem::Strategy& strategy, const tandem::nn::Module& model,
                tandem::data::DistributedDataset& test_data,
                tandem::metrics::SparseCategoricalAccuracy& accuracy) {
  accuracy.reset_state();
  auto eval_step = [&](tandem::ReplicaContext&, const tandem::data::Batch& batch) {
    accuracy.update_state(batch.labels(), model(batch.features(), /*training=*/false));
  };
  for (const auto& batch : test_data) {
    strategy.run(eval_step, batch);
  }
  // Each worker evaluated its shard; result() adds up every worker's totals.
  return accuracy.result();
}

}  // namespace samples
