// Interop: h5py (python3-h5py) reads a checkpoint of the sample MLP and finds the Keras layout with
// Tandem's exact values; Keras (TensorFlow, when installed) loads it with model.load_weights and
// reaches the test accuracy Tandem reports. Scripts: tests/interop/.
#include <cstdio>

#include "interop_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

/// One Adam update on a batch of `images`, so weights and slots are no longer initial values.
void train_step(td::nn::Sequential& model, td::optim::Optimizer& optimizer,
                const td::Tensor& images, const td::Tensor& labels) {
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::GradientTape tape;
  const td::Tensor logits = model(images, /*training=*/true);
  const td::Tensor loss = td::compute_average_loss(
      td::losses::sparse_categorical_crossentropy(labels, logits, /*from_logits=*/true),
      images.dim(0));
  optimizer.apply_gradients(tape.gradient(loss, variables), variables);
}

}  // namespace

TEST_CASE("checkpoint interop: h5py reads the sample MLP's checkpoint in the Keras layout",
          "[cpu][checkpoint]") {
  TempDir dir;
  td::nn::Sequential model = sample_mlp();
  td::optim::Adam optimizer;
  td::Generator g(1);
  train_step(model, optimizer, td::Tensor::uniform({16, 28, 28}, g),
             td::Tensor::from_vector(std::vector<int64_t>(16, 3)));
  td::CheckpointManager manager(td::Checkpoint({{"model", &model}, {"optimizer", &optimizer}}),
                                dir.str());
  const std::string path = *manager.save();
  for (const td::Variable& v : model.weights()) {
    std::string name = v.name();  // dense_1/kernel -> dense_1__kernel
    name.replace(name.find('/'), 1, "__");
    const td::Tensor value = v.copy(0);
    write_text(dir.file(name + ".f32"),
               std::string(static_cast<const char*>(value.raw_data()), value.nbytes()));
  }
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string log = dir.file("h5py.log");
  const int status = shell(python + " " + kInteropDir + "/check_h5py.py " + path + " " + dir.str() +
                           " >" + log + " 2>&1");
  INFO("check_h5py.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("h5py or numpy is not installed for " << python << " (Debian: python3-h5py); skipped");
    return;
  }
  CHECK(status == 0);
}

TEST_CASE("checkpoint interop: Keras load_weights reaches Tandem's test accuracy",
          "[cpu][checkpoint][interop][slow]") {
  const std::string data_dir = fashion_mnist_or_skip("t10k-images-idx3-ubyte.gz");
  if (data_dir.empty()) return;
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  // A briefly trained MLP (300 steps of 128 examples), its test accuracy computed by Tandem.
  td::nn::Sequential model = sample_mlp();
  td::optim::Adam optimizer;
  const td::data::Dataset train = td::data::fashion_mnist(td::data::Split::kTrain)
                                      .shuffle(10000, /*seed=*/7)
                                      .batch(128)
                                      .take(300);
  for (const td::data::Element& batch : train) train_step(model, optimizer, batch[0], batch[1]);
  td::metrics::SparseCategoricalAccuracy accuracy("test_accuracy");
  for (const td::data::Element& batch : td::data::fashion_mnist(td::data::Split::kTest).batch(1000))
    accuracy.update_state(batch[1], model(batch[0], /*training=*/false));
  const double tandem_accuracy = accuracy.result();
  CHECK(tandem_accuracy > 0.75);

  // TANDEM_CKPT_INTEROP_DIR keeps the checkpoint (for docs); a temporary directory otherwise.
  TempDir temp;
  const std::string kept = env_or_empty("TANDEM_CKPT_INTEROP_DIR");
  const std::string dir = kept.empty() ? temp.str() : kept;
  td::CheckpointManager manager(td::Checkpoint({{"model", &model}, {"optimizer", &optimizer}}),
                                dir);
  const std::string path = *manager.save();
  char accuracy_text[32];
  std::snprintf(accuracy_text, sizeof(accuracy_text), "%.6f", tandem_accuracy);
  const std::string log = dir + "/keras_load.log";
  const int status = shell(python + " " + kInteropDir + "/keras_load.py " + path + " " +
                           accuracy_text + " >" + log + " 2>&1");
  INFO("keras_load.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_load.py could not import TensorFlow; skipped");
    return;
  }
  CHECK(status == 0);
}
