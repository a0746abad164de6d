// Activation functions of Dense and Conv2D, by enum (Keras names: relu, sigmoid, tanh, gelu,
// softmax).
#pragma once

#include <string_view>

#include "tandem/tensor/tensor.h"

namespace tandem::nn {

/// The activation a Dense, Conv2D or ActivationLayer applies: kNone (identity, Keras's
/// "linear"), kRelu, kSigmoid, kTanh, kGelu (exact erf form) or kSoftmax (over the last axis).
enum class Activation { kNone, kRelu, kSigmoid, kTanh, kGelu, kSoftmax };

/// Applies `activation` (kGelu is the exact erf form, Keras' default; kSoftmax is over the last
/// axis). Records on gradient tapes like any op.
Tensor apply_activation(const Tensor& x, Activation activation);
/// Keras name: "linear", "relu", "sigmoid", "tanh", "gelu", "softmax".
std::string_view activation_name(Activation activation);

}  // namespace tandem::nn
