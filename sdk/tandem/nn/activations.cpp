// Activation dispatch onto the ops.
#include "tandem/nn/activations.h"

#include "tandem/ops/ops.h"

namespace tandem::nn {

Tensor apply_activation(const Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return ops::relu(x);
    case Activation::kSigmoid:
      return ops::sigmoid(x);
    case Activation::kTanh:
      return ops::tanh(x);
    case Activation::kGelu:
      return ops::gelu(x, /*approximate=*/false);
    case Activation::kSoftmax:
      return ops::softmax(x, /*axis=*/-1);
  }
  TANDEM_THROW("apply_activation: unknown activation ", static_cast<int>(activation));
}

std::string_view activation_name(Activation activation) {
  switch (activation) {
    case Activation::kNone:
      return "linear";
    case Activation::kRelu:
      return "relu";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kTanh:
      return "tanh";
    case Activation::kGelu:
      return "gelu";
    case Activation::kSoftmax:
      return "softmax";
  }
  return "unknown";
}

}  // namespace tandem::nn
