// fashion_mnist_resnet: a small ResNet (a 3x3 convolution, batch norm and relu, then three
// residual blocks of 16, 32 and 64 filters, the last two halving the image, global average
// pooling and a dense layer) trained with Adam on Fashion-MNIST images [28, 28, 1],
// data-parallel with MirroredStrategy. --sync-bn normalizes over the global batch (every replica
// and worker) instead of each replica's slice. The residual block is a user module
// (residual_block.h); the training loop is the CNN sample's (common/image_classifier). Run from
// the repository root; --help lists the flags.
#include <cstdlib>
#include <exception>
#include <iostream>

#include "common/flags.h"
#include "common/image_classifier.h"
#include "common/training.h"
#include "fashion_mnist_resnet/residual_block.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

const samples::SampleInfo kInfo{
    .name = "fashion_mnist_resnet",
    .description =
        "trains a small ResNet (batch norm, residual blocks of 16-32-64 filters, "
        "global average pooling; Adam) on Fashion-MNIST with MirroredStrategy",
    .default_checkpoint_dir = "checkpoints/fashion_mnist_resnet",
    .batch_norm = true,
    // Measured at 10 epochs on 2 replicas with --sync-bn: constant 0.001 0.904, cosine from 0.001
    // 0.917, from 0.002 0.924, from 0.003 0.926, from 0.005 0.928 (bench/RESULTS.md).
    .default_lr_schedule = "cosine",
    .default_learning_rate = 0.005,
    .tfrecords = true};

/// 28x28x1 -> 28x28x16 -> (block) 28x28x16 -> (block) 14x14x32 -> (block) 7x7x64 -> 64 -> 10.
td::nn::Sequential make_model(bool sync_bn) {
  namespace nn = td::nn;
  return nn::Sequential(
      {nn::Conv2D(16, /*kernel_size=*/3, /*strides=*/1, nn::Padding::kSame, nn::Activation::kNone,
                  /*use_bias=*/false),
       nn::BatchNormalization({.synchronized = sync_bn}),
       nn::ActivationLayer(nn::Activation::kRelu), samples::ResidualBlock(16, 1, sync_bn),
       samples::ResidualBlock(32, 2, sync_bn), samples::ResidualBlock(64, 2, sync_bn),
       nn::GlobalAveragePooling2D(), nn::Dense(10)});
}

}  // namespace

int main(int argc, char** argv) {
  const samples::Flags flags = samples::parse_flags_or_exit(argc, argv, kInfo);
  try {
    return samples::train_image_classifier(kInfo, flags, [&] { return make_model(flags.sync_bn); });
  } catch (const std::exception& error) {
    std::cerr << kInfo.name << ": " << error.what() << std::endl;
    return EXIT_FAILURE;
  }
}
