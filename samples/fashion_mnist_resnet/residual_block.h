// A ResNet basic block written as a user module: conv 3x3 -> batch norm -> relu -> conv 3x3 ->
// batch norm, plus the block's input (through a strided 1x1 convolution and a batch norm when
// the block changes the shape), then relu. Its layers are children (add_child in the
// constructor, build_child in build_variables, in the order call uses them), so their variables
// are named "<block>/<layer>/<weight>", appear in weights() and checkpoints, and are mirrored
// like any layer's under strategy.scope(). docs/layers.md shows it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tandem/tandem.h"

namespace samples {

class ResidualBlockImpl : public tandem::nn::ModuleImpl {
 public:
  /// `filters` output channels; `stride` 2 halves the height and width; `sync_bn`: batch norm
  /// over the global batch.
  ResidualBlockImpl(int64_t filters, int64_t stride, bool sync_bn)
      : ModuleImpl("residual_block"), filters_(filters), stride_(stride) {
    namespace nn = tandem::nn;
    const nn::BatchNormalizationOptions bn{.synchronized = sync_bn};
    // The first batch norm's ReLU in its own pass (Keras: BatchNormalization, then relu).
    const nn::BatchNormalizationOptions bn_relu{.synchronized = sync_bn,
                                                .activation = nn::Activation::kRelu};
    const auto conv = [](int64_t filters, int64_t size, int64_t stride) {
      return nn::Conv2D(filters, size, stride, nn::Padding::kSame, nn::Activation::kNone,
                        /*use_bias=*/false);  // the batch norm after it has the bias
    };
    // Named as a Keras layer's attributes would be (self.conv1, ...): the variables are
    // "residual_block/conv1/kernel", and Keras 3's .weights.h5 of the same block loads.
    conv1_ = add_child("conv1", conv(filters, 3, stride));
    bn1_ = add_child("bn1", nn::BatchNormalization(bn_relu));
    conv2_ = add_child("conv2", conv(filters, 3, 1));
    bn2_ = add_child("bn2", nn::BatchNormalization(bn));
    if (stride != 1)
      shortcut_ = add_child("shortcut",
                            nn::Sequential({conv(filters, 1, stride), nn::BatchNormalization(bn)}));
  }

  std::string type_name() const override { return "ResidualBlock"; }

  /// [H, W, C] -> [ceil(H / stride), ceil(W / stride), filters] (same padding).
  tandem::Shape compute_output_shape(const tandem::Shape& s) const override {
    TANDEM_CHECK(s.rank() == 3, describe(), " needs images [batch, height, width, channels]");
    TANDEM_CHECK(stride_ != 1 || s[2] == filters_, describe(), ": ", s[2], " input channels but ",
                 filters_, " filters need a stride of 2 (a projection)");
    return tandem::Shape{(s[0] + stride_ - 1) / stride_, (s[1] + stride_ - 1) / stride_, filters_};
  }

  tandem::Tensor call(const tandem::Tensor& x, bool training) override {
    namespace ops = tandem::ops;
    tandem::Tensor y = bn1_(conv1_(x), training);  // with its ReLU
    y = bn2_(conv2_(y), training);
    const tandem::Tensor skip = shortcut_.defined() ? shortcut_(x, training) : x;
    // The sum and the block's last ReLU in one pass (relu(add(y, skip)), bit for bit).
    return ops::add(y, skip, ops::FusedActivation::kRelu);
  }

 protected:
  void build_variables(const tandem::Shape& input_shape, tandem::Generator& generator) override {
    tandem::Shape h = build_child(conv1_, input_shape, generator);
    h = build_child(bn1_, h, generator);
    h = build_child(conv2_, h, generator);
    build_child(bn2_, h, generator);
    if (shortcut_.defined()) build_child(shortcut_, input_shape, generator);
  }

 private:
  int64_t filters_, stride_;
  tandem::nn::Module conv1_, bn1_, conv2_, bn2_;
  tandem::nn::Module shortcut_;  // only when the block changes the shape
};

/// The block as a layer: Sequential({..., ResidualBlock(32, 2), ...}).
class ResidualBlock : public tandem::nn::Module {
 public:
  ResidualBlock(int64_t filters, int64_t stride = 1, bool sync_bn = false)
      : Module(std::make_shared<ResidualBlockImpl>(filters, stride, sync_bn)) {}
};

}  // namespace samples
