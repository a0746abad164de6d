// load_weights: files Keras itself wrote (tests/interop/keras_write_weights.py, when TensorFlow
// is installed) give Tandem Keras's logits; files in the Keras layouts written here check the
// matching rules, the errors (layer, names and shapes), and loading into a mirrored model.
#include <fcntl.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>

#include "interop_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

/// Every variable's value (replica 0's copy), in the model's order.
std::vector<std::vector<float>> values_of(const td::nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (const td::Variable& v : model.weights()) out.push_back(v.copy(0).to_vector<float>());
  return out;
}

/// How a legacy (h5) file written by write_legacy looks.
struct LegacyOptions {
  bool full_model = false;    ///< under /model_weights (model.save) instead of at the root
  bool fixed_length = false;  ///< layer_names / weight_names as fixed-length byte strings
  bool tf_keras_names =
      false;  ///< "dense/kernel:0" (tf-keras) instead of "sequential/dense/kernel"
  std::vector<std::string> layer_names;  ///< Keras's names of the model's layers; default theirs
};

/// Writes `model`'s weights in Keras's legacy h5 layout: layer_names lists every layer (those
/// without weights too), each layer's group lists its datasets in weight_names.
void write_legacy(const std::string& path, const td::nn::Module& model,
                  const LegacyOptions& options = {}) {
  const std::vector<td::nn::Module> layers = model.children();
  std::vector<std::string> names = options.layer_names;
  for (size_t i = names.size(); i < layers.size(); ++i) names.push_back(layers[i].name());
  auto write_names = [&](const td::h5::Group& group, const std::string& attribute,
                         const std::vector<std::string>& values) {
    if (options.fixed_length)
      group.write_attr_fixed(attribute, values);
    else
      group.write_attr(attribute, values);
  };
  auto write_weights = [&](const td::h5::Group& weights) {
    write_names(weights, "layer_names", names);
    weights.write_attr("backend", std::string("tensorflow"));
    weights.write_attr("keras_version", std::string(options.tf_keras_names ? "2.15.0" : "3.15.1"));
    for (size_t i = 0; i < layers.size(); ++i) {
      const td::h5::Group group = weights.create_group(names[i]);
      std::vector<std::string> weight_names;
      for (const td::Variable& v : layers[i].weights()) {
        const std::string variable = v.name().substr(v.name().rfind('/') + 1);
        const std::string name = options.tf_keras_names ? names[i] + "/" + variable + ":0"
                                                        : "sequential/" + names[i] + "/" + variable;
        group.write_tensor(name, v.copy(0));
        weight_names.push_back(name);
      }
      write_names(group, "weight_names", weight_names);
    }
  };
  td::h5::File file = td::h5::File::create(path);
  if (options.full_model)
    write_weights(file.root().create_group("model_weights"));
  else
    write_weights(file.root());
  file.close();
}

/// Writes `model`'s weights in the Keras 3 .weights.h5 layout under the paths `keys` (one per
/// layer of the model: Keras's class-and-rank names, "dense", "dense_1", ...).
void write_keras3(const std::string& path, const td::nn::Module& model,
                  const std::vector<std::string>& keys) {
  td::h5::File file = td::h5::File::create(path);
  const std::vector<td::nn::Module> layers = model.children();
  REQUIRE(keys.size() == layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const td::h5::Group vars = file.root().require_group("layers/" + keys[i] + "/vars");
    vars.write_attr("name", keys[i]);
    const std::vector<td::Variable> weights = layers[i].weights();
    for (size_t k = 0; k < weights.size(); ++k)
      vars.write_tensor(std::to_string(k), weights[k].copy(0));
  }
  file.root().require_group("vars").write_attr("name", std::string("sequential"));
  file.root().require_group("optimizer/vars");
  file.close();
}

/// The message of the CheckpointMismatchError that load_weights(model, path) raises ("" and a
/// failed check when it raises none or another error).
std::string mismatch_message(const td::nn::Module& model, const std::string& path) {
  try {
    td::load_weights(model, path);
  } catch (const td::CheckpointMismatchError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("load_weights raised another error than CheckpointMismatchError: " << e.what());
  }
  FAIL("load_weights accepted " << path);
  return "";
}

}  // namespace

TEST_CASE("load_weights: Keras's files of the sample MLP give Keras's logits",
          "[cpu][checkpoint][interop][slow]") {
  const std::string data_dir = fashion_mnist_or_skip("t10k-images-idx3-ubyte.gz");
  if (data_dir.empty()) return;
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  TempDir dir;
  const std::string log = dir.file("keras_write_weights.log");
  const int status = shell(python + " " + kInteropDir + "/keras_write_weights.py " + dir.str() +
                           " --data-dir " + data_dir + " >" + log + " 2>&1");
  INFO("keras_write_weights.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_write_weights.py could not import TensorFlow and Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);

  // Keras's logits on the first 1000 test images, and those images as Tandem reads them.
  const std::string logits_bytes = read_text(dir.file("logits.f32"));
  REQUIRE(logits_bytes.size() == 1000 * 10 * sizeof(float));
  std::vector<float> keras_logits(1000 * 10);
  std::memcpy(keras_logits.data(), logits_bytes.data(), logits_bytes.size());
  td::Tensor images;
  for (const td::data::Element& batch :
       td::data::fashion_mnist(td::data::Split::kTest, data_dir).batch(1000)) {
    images = batch[0];
    break;
  }
  REQUIRE(images.shape() == td::Shape({1000, 28, 28}));

  std::vector<std::string> files;
  {
    std::istringstream list(read_text(dir.file("files.txt")));
    for (std::string line; std::getline(list, line);) files.push_back(line);
  }
  // The three layouts Keras 3 writes are always there; tf-keras adds two when installed.
  REQUIRE(files.size() >= 3);
  CHECK(files[0] == "keras3.weights.h5");
  CHECK(files[1] == "legacy_weights.h5");
  CHECK(files[2] == "legacy_model.h5");
  for (const std::string& name : files) {
    INFO("file " << name);
    td::nn::Sequential model = sample_mlp(/*seed=*/3);
    // Before loading, Tandem's own initial weights give other logits (so the check can fail).
    const std::vector<float> before = model(images).to_vector<float>();
    double initial_difference = 0;
    for (size_t i = 0; i < before.size(); ++i)
      initial_difference =
          std::max<double>(initial_difference, std::fabs(before[i] - keras_logits[i]));
    CHECK(initial_difference > 0.5);

    td::load_weights(model, dir.file(name));
    const std::vector<float> logits = model(images).to_vector<float>();
    REQUIRE(logits.size() == keras_logits.size());
    double max_difference = 0, max_relative = 0;
    size_t outside = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double difference = std::fabs(double{logits[i]} - keras_logits[i]);
      max_difference = std::max(max_difference, difference);
      max_relative =
          std::max(max_relative, difference / std::max(1.0, std::fabs(double{keras_logits[i]})));
      // Within 1e-5, relative to the logit's size where it exceeds 1 (float32 sums of 784
      // products in another order).
      if (difference > 1e-5 * std::max(1.0, std::fabs(double{keras_logits[i]}))) ++outside;
    }
    std::printf("load_weights(%s): max |Tandem - Keras| logit difference %.3g (relative %.3g)\n",
                name.c_str(), max_difference, max_relative);
    CHECK(outside == 0);
  }
}

TEST_CASE("load_weights: the legacy and Keras 3 layouts load every weight", "[cpu][checkpoint]") {
  TempDir dir;
  const td::nn::Sequential source = sample_mlp(/*seed=*/1);
  const std::vector<std::vector<float>> expected = values_of(source);

  SECTION("legacy weights, tf-keras style: fixed-length names, kernel:0, other layer names") {
    write_legacy(dir.file("w.h5"), source,
                 {.fixed_length = true,
                  .tf_keras_names = true,
                  .layer_names = {"flatten_4", "dense_9", "dense_10", "dense_11"}});
    const td::nn::Sequential model = sample_mlp(/*seed=*/2);
    REQUIRE(values_of(model) != expected);
    td::load_weights(model, dir.file("w.h5"));
    CHECK(values_of(model) == expected);
  }
  SECTION("legacy full model: /model_weights, Keras 3 names") {
    write_legacy(dir.file("m.h5"), source, {.full_model = true, .layer_names = {}});
    const td::nn::Sequential model = sample_mlp(/*seed=*/2);
    td::load_weights(model, dir.file("m.h5"));
    CHECK(values_of(model) == expected);
  }
  SECTION("Keras 3 .weights.h5: /layers/<class and rank>/vars") {
    write_keras3(dir.file("k.weights.h5"), source, {"flatten", "dense", "dense_1", "dense_2"});
    const td::nn::Sequential model = sample_mlp(/*seed=*/2);
    td::load_weights(model, dir.file("k.weights.h5"));
    CHECK(values_of(model) == expected);
  }
  SECTION("a Tandem checkpoint (its /model_weights is the legacy layout)") {
    td::nn::Sequential saved = sample_mlp(/*seed=*/1);
    td::CheckpointManager manager(td::Checkpoint({{"model", &saved}}), dir.str());
    const std::string path = *manager.save();
    const td::nn::Sequential model = sample_mlp(/*seed=*/2);
    td::load_weights(model, path);
    CHECK(values_of(model) == expected);
  }
}

TEST_CASE("load_weights: a mirrored model gets the values in every replica's copy",
          "[cpu][checkpoint]") {
  TempDir dir;
  const td::nn::Sequential source = sample_mlp(/*seed=*/1);
  write_legacy(dir.file("m.h5"), source, {.full_model = true, .layer_names = {}});
  auto strategy = td::MirroredStrategy::cpu(2);
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(256, td::nn::Activation::kRelu),
                            td::nn::Dense(128, td::nn::Activation::kRelu), td::nn::Dense(10)});
  {
    auto scope = strategy.scope();
    model.set_seed(2);
    model.build({28, 28});
  }
  td::load_weights(model, dir.file("m.h5"));
  const std::vector<td::Variable> loaded = model.weights();
  const std::vector<td::Variable> expected = source.weights();
  REQUIRE(loaded.size() == expected.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    INFO("variable " << loaded[i].name());
    REQUIRE(loaded[i].num_copies() == 2);
    for (int r = 0; r < loaded[i].num_copies(); ++r)
      CHECK(loaded[i].copy(r).to_vector<float>() == expected[i].copy(0).to_vector<float>());
  }
  // Loading inside strategy.run is refused, as restore is.
  CHECK_THROWS_WITH(strategy.run([&](td::ReplicaContext&) {
    td::load_weights(model, dir.file("m.h5"));
    return 0;
  }),
                    Catch::Contains("inside strategy.run"));
}

TEST_CASE("load_weights: a file of another model names the layer and both shapes",
          "[cpu][checkpoint]") {
  TempDir dir;
  // Keras's names of a second model in a Python session (dense_1, dense_2) are matched by order.
  const td::nn::Sequential file_model = [] {
    td::nn::Sequential m({td::nn::Flatten(), td::nn::Dense(128), td::nn::Dense(10)});
    m.build({28, 28});
    return m;
  }();
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(128), td::nn::Dense(64)});
  model.build({28, 28});
  const std::vector<std::vector<float>> before = values_of(model);

  SECTION("legacy h5: the layer's index, its names on both sides, kernel shapes") {
    const std::string path = dir.file("m.h5");
    write_legacy(path, file_model,
                 {.full_model = true, .layer_names = {"flatten_1", "dense_1", "dense_2"}});
    const std::string message = mismatch_message(model, path);
    CHECK_THAT(message, Catch::StartsWith("load_weights(\"" + path + "\"): layer 2 (Tandem " +
                                          "\"dense_1\", Keras \"dense_2\"): kernel shape " +
                                          "[128, 10] in the file"));
    CHECK_THAT(message, Catch::EndsWith("[128, 64] in the model"));
  }
  SECTION("Keras 3 .weights.h5: the same, with the dataset's path") {
    const std::string path = dir.file("m.weights.h5");
    write_keras3(path, file_model, {"flatten", "dense", "dense_1"});
    CHECK(
        mismatch_message(model, path) ==
        "load_weights(\"" + path + "\"): layer 2 (Tandem \"dense_1\", Keras \"dense_1\"): " +
            "kernel shape [128, 10] in the file (/layers/dense_1/vars/0), [128, 64] in the model");
  }
  // A failed load changes nothing (layer 1 fits, but is not assigned either).
  CHECK(values_of(model) == before);
}

TEST_CASE("load_weights: a different number of layers or weights is named", "[cpu][checkpoint]") {
  TempDir dir;
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(16), td::nn::Dense(4)});
  model.build({8});
  td::nn::Sequential three({td::nn::Dense(16), td::nn::Dense(16), td::nn::Dense(4)});
  three.build({8});

  SECTION("legacy: three layers with weights in the file, two in the model") {
    write_legacy(dir.file("w.h5"), three);
    CHECK(mismatch_message(model, dir.file("w.h5")) ==
          "load_weights(\"" + dir.file("w.h5") + "\"): the file has 3 layers with weights " +
              "(\"dense\", \"dense_1\", \"dense_2\"), the model has 2 (\"dense\", \"dense_1\")");
  }
  SECTION("Keras 3: the same") {
    write_keras3(dir.file("w.weights.h5"), three, {"dense", "dense_1", "dense_2"});
    CHECK_THAT(mismatch_message(model, dir.file("w.weights.h5")),
               Catch::Contains("the file has 3 layers with weights") &&
                   Catch::Contains("the model has 2"));
  }
  SECTION("a layer without a bias in the file") {
    td::nn::Sequential no_bias({td::nn::Flatten(),
                                td::nn::Dense(16, td::nn::Activation::kNone,
                                              /*use_bias=*/false),
                                td::nn::Dense(4)});
    no_bias.build({8});
    write_legacy(dir.file("b.h5"), no_bias, {.tf_keras_names = true, .layer_names = {}});
    CHECK(mismatch_message(model, dir.file("b.h5")) ==
          "load_weights(\"" + dir.file("b.h5") + "\"): layer 1 (Tandem \"dense\", Keras " +
              "\"dense\"): the file has 1 weights (\"dense/kernel:0\"), the model 2 (\"kernel\", " +
              "\"bias\")");
  }
}

TEST_CASE("load_weights: a file in none of Keras's layouts is refused", "[cpu][checkpoint]") {
  TempDir dir;
  td::nn::Sequential model({td::nn::Dense(4)});
  model.build({8});
  {
    td::h5::File file = td::h5::File::create(dir.file("other.h5"));
    file.root().create_group("images");
    file.root().write_attr("layer_count", int64_t{1});
    file.close();
  }
  CHECK_THROWS_WITH(td::load_weights(model, dir.file("other.h5")),
                    Catch::StartsWith("load_weights(\"" + dir.file("other.h5") +
                                      "\"): not a Keras weights file") &&
                        Catch::Contains("its root holds [\"images\"]"));
  write_text(dir.file("text.h5"), "not HDF5");
  CHECK_THROWS_WITH(td::load_weights(model, dir.file("text.h5")),
                    Catch::Contains(dir.file("text.h5")));
  td::nn::Sequential unbuilt({td::nn::Dense(4)});
  CHECK_THROWS_WITH(td::load_weights(unbuilt, dir.file("other.h5")),
                    Catch::Contains("is not built"));
}

namespace {

std::string keras_fixture(const std::string& name) {
  return (fs::path(TANDEM_SOURCE_DIR) / "tests/checkpoint/fixtures" / name).string();
}

/// Dense(16, relu), Sequential(Dense(12, relu), Dense(6)), Dense(4) on 8 features: the model of
/// fixtures/keras_nested (make_keras_nested.py).
td::nn::Sequential nested_model() {
  td::nn::Sequential inner({td::nn::Dense(12, td::nn::Activation::kRelu), td::nn::Dense(6)});
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), inner, td::nn::Dense(4)});
  model.build({8});
  return model;
}

}  // namespace

TEST_CASE("load_weights: a nested model, in every layout Keras and tf-keras write",
          "[cpu][checkpoint][interop]") {
  // Keras's own files (make_keras_nested.py): its outputs on a fixed input are the reference.
  std::vector<float> expected;
  {
    std::istringstream lines(read_text(keras_fixture("keras_nested/outputs.txt")));
    for (float v; lines >> v;) expected.push_back(v);
  }
  REQUIRE(expected.size() == 8);
  std::vector<float> x(16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) / 10.0f - 0.7f;
  const td::Tensor input = td::Tensor::from_vector(x, td::Shape({2, 8}));
  for (const char* name :
       {"keras3.weights.h5", "keras3_legacy.h5", "tf_keras.weights.h5", "tf_keras_legacy.h5"}) {
    INFO(name);
    td::nn::Sequential model = nested_model();
    td::load_weights(model, keras_fixture(std::string("keras_nested/") + name));
    const std::vector<float> got = model(input).to_vector<float>();
    REQUIRE(got.size() == expected.size());
    double difference = 0;
    for (size_t i = 0; i < got.size(); ++i)
      difference = std::max<double>(difference, std::fabs(got[i] - expected[i]));
    CHECK(difference < 1e-5);
  }
  // A flat model of the same weights is another model to Keras 3's paths: refused, counting
  // the file's layers with weights, nested ones included.
  td::nn::Sequential flat({td::nn::Dense(16, td::nn::Activation::kRelu),
                           td::nn::Dense(12, td::nn::Activation::kRelu), td::nn::Dense(6),
                           td::nn::Dense(4)});
  flat.build({8});
  CHECK_THAT(mismatch_message(flat, keras_fixture("keras_nested/keras3.weights.h5")),
             Contains("layer 2 (Tandem \"dense_2\"): Keras stores it at /layers/dense_2/vars, "
                      "which the file lacks (its layers with weights: \"dense\", \"dense_1\", "
                      "\"sequential/layers/dense\", \"sequential/layers/dense_1\")"));
  // One layer too few: the count names every layer with weights, nested ones included.
  td::nn::Sequential short_model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(4)});
  short_model.build({8});
  CHECK_THAT(mismatch_message(short_model, keras_fixture("keras_nested/keras3.weights.h5")),
             Contains("the file has 4 layers with weights (\"dense\", \"dense_1\", "
                      "\"sequential/layers/dense\", \"sequential/layers/dense_1\"), the model "
                      "has 2"));
}

TEST_CASE("load_weights: non-finite weights, data outside the file and links elsewhere",
          "[cpu][checkpoint][interop]") {
  TempDir dir;
  auto copy = [&](const std::string& name) {
    const std::string path = dir.file(name);
    fs::copy_file(keras_fixture("crafted/" + name), path);
    return path;
  };
  SECTION("NaN and Inf are refused by name and count, unless asked for") {
    const std::string path = copy("keras_nan.h5");
    td::nn::Sequential model = nested_model();
    const std::vector<float> before = model.weights()[0].copy(0).to_vector<float>();
    CHECK_THROWS_WITH(
        td::load_weights(model, path),
        Contains(path) && Contains("/dense/dense/kernel:0 holds 128 non-finite values "
                                   "(128 NaN, 0 Inf) of 128"));
    CHECK(model.weights()[0].copy(0).to_vector<float>() == before);  // nothing assigned
    td::load_weights(model, path, {.allow_non_finite = true});
    CHECK(std::isnan(model.weights()[0].copy(0).to_vector<float>()[0]));
    CHECK(std::isinf(model.weights()[1].copy(0).to_vector<float>()[0]));
    // A float64 weight finite in the file but too large for the model's float32.
    const std::string overflow = copy("keras_float64_overflow.h5");
    td::nn::Sequential other = nested_model();
    CHECK_THROWS_WITH(td::load_weights(other, overflow),
                      Contains("/dense/dense/kernel:0 holds 128 non-finite values (0 NaN, 128 Inf) "
                               "of 128 as float32"));
  }
  SECTION("a bias stored in /etc/passwd or /dev/urandom is never read") {
    for (const char* name : {"keras_external_passwd.h5", "keras_external_urandom.h5"}) {
      td::nn::Sequential model = nested_model();
      const std::string path = copy(name);
      CHECK_THROWS_WITH(
          td::load_weights(model, path),
          Contains(path) && Contains("bias:0: its data is stored in 1 external file"));
    }
  }
  SECTION("an external link to a FIFO is not followed (nothing blocks)") {
    const std::string path = copy("keras_external_link_fifo.h5");
    REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
    td::nn::Sequential model = nested_model();
    CHECK_THROWS_WITH(
        td::load_weights(model, path),
        Contains(path) && Contains("kernel:0 is an external link to \"/x\" in \"fifo\""));
  }
}

TEST_CASE("load_weights: a file rewritten in place is read again, not answered from memory",
          "[cpu][checkpoint]") {
  // The variable-length names of a file are read once per open file: a file rewritten at the
  // same path with the same size, inode and modification time (within the clock's granularity)
  // must show its new names.
  TempDir dir;
  const std::string path = dir.file("m.h5");
  const td::nn::Sequential file_model = [] {
    td::nn::Sequential m({td::nn::Flatten(), td::nn::Dense(128), td::nn::Dense(10)});
    m.build({28, 28});
    return m;
  }();
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(128), td::nn::Dense(64)});
  model.build({28, 28});

  write_legacy(path, file_model, {.layer_names = {"flatten_1", "dense_1", "dense_2"}});
  struct stat first {};
  REQUIRE(::stat(path.c_str(), &first) == 0);
  CHECK_THAT(mismatch_message(model, path), Contains("Keras \"dense_2\""));

  // Replaced as a writer that deletes and creates would: the new file often gets the freed inode.
  REQUIRE(std::remove(path.c_str()) == 0);
  write_legacy(path, file_model, {.layer_names = {"flatten_7", "dense_7", "dense_8"}});
  const timespec times[2] = {first.st_atim, first.st_mtim};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
  struct stat second {};
  REQUIRE(::stat(path.c_str(), &second) == 0);
  REQUIRE(second.st_size == first.st_size);
  INFO("inode " << first.st_ino << " then " << second.st_ino);
  CHECK_THAT(mismatch_message(model, path), Contains("Keras \"dense_8\""));
}
