// fashion_mnist_cnn: TensorFlow's tutorial convolutional network (Conv2D(32, 5, same)-MaxPool-
// Conv2D(64, 5, same)-MaxPool-Dense(1024)-Dropout(0.4)-Dense(10), ReLU; the "2 Conv + pooling"
// row of the Fashion-MNIST benchmark table, 0.916) trained with Adam on Fashion-MNIST images
// reshaped to [28, 28, 1], data-parallel with MirroredStrategy. The training loop
// (common/image_classifier) is fashion_mnist_mlp's (docs/design.md §1); only the model and the
// input shape differ. Run from the repository root; --help lists the flags.
#include <cstdlib>
#include <exception>
#include <iostream>

#include "common/flags.h"
#include "common/image_classifier.h"
#include "common/training.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

const samples::SampleInfo kInfo{
    .name = "fashion_mnist_cnn",
    .description =
        "trains a CNN (Conv2D 32-MaxPool-Conv2D 64-MaxPool-Dense 1024-Dropout 0.4-Dense 10, "
        "Adam) on Fashion-MNIST with MirroredStrategy",
    .default_checkpoint_dir = "checkpoints/fashion_mnist_cnn",
    .default_lr_schedule = "constant",
    .tfrecords = true};

/// TensorFlow's tutorial convnet: 28x28x1 -> 28x28x32 -> 14x14x32 -> 14x14x64 -> 7x7x64 -> 1024
/// -> dropout (training only) -> 10 logits.
td::nn::Sequential make_model() {
  const td::nn::Activation relu = td::nn::Activation::kRelu;
  td::nn::Sequential model(
      {td::nn::Conv2D(32, /*kernel_size=*/5, /*strides=*/1, td::nn::Padding::kSame, relu),
       td::nn::MaxPool2D(/*pool_size=*/2),
       td::nn::Conv2D(64, /*kernel_size=*/5, /*strides=*/1, td::nn::Padding::kSame, relu),
       td::nn::MaxPool2D(/*pool_size=*/2), td::nn::Flatten(), td::nn::Dense(1024, relu),
       td::nn::Dropout(0.4), td::nn::Dense(10)});
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  const samples::Flags flags = samples::parse_flags_or_exit(argc, argv, kInfo);
  try {
    return samples::train_image_classifier(kInfo, flags, make_model);
  } catch (const std::exception& error) {
    std::cerr << kInfo.name << ": " << error.what() << std::endl;
    return EXIT_FAILURE;
  }
}
