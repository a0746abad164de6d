// The training loop of the image samples: Fashion-MNIST as [28, 28, 1] images, a model the
// sample makes, Adam, MirroredStrategy (or the workers of a job), checkpoints, metrics and
// Ctrl-C handling as in fashion_mnist_mlp.
#pragma once

#include <functional>

#include "common/flags.h"
#include "tandem/tandem.h"

namespace samples {

/// Trains the model `make_model` returns (called once, under the strategy's scope and the
/// --precision policy; built here for [28, 28, 1] with --seed) and evaluates it after each
/// epoch; returns the program's exit status.
int train_image_classifier(const SampleInfo& info, const Flags& flags,
                           const std::function<tandem::nn::Sequential()>& make_model);

}  // namespace samples
