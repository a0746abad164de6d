// Sequential: Keras auto-naming, building layer by layer, and the forward chain.
#include "tandem/nn/sequential.h"

#include <algorithm>

#include "tandem/nn/layers.h"
#include "tandem/nn/normalization.h"

namespace tandem::nn {

SequentialImpl::SequentialImpl(std::vector<Module> layers)
    : ModuleImpl("sequential"), generators_(std::make_shared<ReplicaGenerators>(kDefaultSeed)) {
  for (Module& layer : layers) add(std::move(layer));
}

void SequentialImpl::add(Module layer) {
  TANDEM_CHECK(layer.defined(), describe(), ": cannot add an undefined layer");
  TANDEM_CHECK(!built(), describe(), ": add layers before the model is built");
  ModuleImpl& impl = layer.impl();
  TANDEM_CHECK(&impl != this, describe(), ": a model cannot contain itself");
  auto taken = [&](const std::string& name) {
    return std::any_of(layers_.begin(), layers_.end(),
                       [&](const Module& m) { return m.name() == name; });
  };
  for (const Module& m : layers_) {
    TANDEM_CHECK(m.ptr().get() != &impl, describe(), ": layer \"", m.name(),
                 "\" was added twice; create a new layer for each position");
  }
  if (!impl.has_explicit_name() && !impl.built()) {
    // Keras auto-naming: the prefix, then prefix_1, prefix_2, ... (first free name).
    std::string name = impl.default_name();
    for (int i = 1; taken(name); ++i) name = impl.default_name() + "_" + std::to_string(i);
    impl.set_auto_name(name);
  }
  TANDEM_CHECK(!taken(impl.name()), describe(), ": two layers are named \"", impl.name(),
               "\"; layer names must be unique within a model (call set_name before build)");
  impl.set_random_source(generators_);
  layers_.push_back(std::move(layer));
}

Shape SequentialImpl::compute_output_shape(const Shape& input_shape) const {
  Shape shape = input_shape;
  for (const Module& layer : layers_) shape = layer.impl().compute_output_shape(shape);
  return shape;
}

std::string SequentialImpl::child_scope() const {
  return is_scoped() ? ModuleImpl::child_scope() : std::string();
}

void SequentialImpl::build_variables(const Shape& input_shape, Generator& generator) {
  Shape shape = input_shape;
  const std::string scope = child_scope();
  for (const Module& layer : layers_) {
    if (!layer.impl().built()) layer.impl().set_scope(scope);
    layer.impl().build(shape, generator);
    shape = layer.output_shape();
  }
}

Tensor SequentialImpl::call(const Tensor& x, bool training) {
  Tensor y = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    // A BatchNormalization followed by a ReLU layer: one op (the ReLU in the normalizing pass,
    // its gradient in the backward's), the same values; when neither casts its input.
    if (i + 1 < layers_.size()) {
      auto* bn = dynamic_cast<BatchNormalizationImpl*>(&layers_[i].impl());
      const auto* act = dynamic_cast<const ActivationLayerImpl*>(&layers_[i + 1].impl());
      if (bn && act && act->activation() == Activation::kRelu &&
          bn->options().activation == Activation::kNone && bn->built() &&
          y.dtype() == bn->compute_dtype() && y.dtype() == act->compute_dtype()) {
        bn->check_input(y);
        y = bn->call_then_relu(y, training);
        ++i;
        continue;
      }
    }
    y = layers_[i](y, training);
  }
  return y;
}

std::vector<Variable> SequentialImpl::weights() const {
  std::vector<Variable> out;
  for (const Module& layer : layers_) {
    std::vector<Variable> w = layer.weights();
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

void SequentialImpl::set_dtype(DType dtype) {
  ModuleImpl::set_dtype(dtype);
  for (const Module& layer : layers_) layer.impl().set_dtype(dtype);
}

void SequentialImpl::set_seed(uint64_t seed) {
  ModuleImpl::set_seed(seed);
  generators_->reseed(seed);
}

void SequentialImpl::set_random_source(std::shared_ptr<ReplicaGenerators> source) {
  TANDEM_CHECK(source != nullptr, describe(), ": null random source");
  generators_ = std::move(source);
  for (const Module& layer : layers_) layer.impl().set_random_source(generators_);
}

Sequential::Sequential(std::initializer_list<Module> layers)
    : Sequential(std::vector<Module>(layers)) {}
Sequential::Sequential(std::vector<Module> layers)
    : Module(std::make_shared<SequentialImpl>(std::move(layers))) {}
Sequential::Sequential(std::shared_ptr<SequentialImpl> impl) : Module(std::move(impl)) {}

void Sequential::add(Module layer) { model().add(std::move(layer)); }

Module Sequential::layer(size_t index) const {
  const std::vector<Module> all = layers();
  TANDEM_CHECK(index < all.size(), "Sequential \"", name(), "\": layer index ", index,
               " is out of range (", all.size(), " layers)");
  return all[index];
}

Module Sequential::get_layer(const std::string& name) const {
  std::string names;
  for (const Module& m : layers()) {
    if (m.name() == name) return m;
    if (!names.empty()) names += ", ";
    names += m.name();
  }
  TANDEM_THROW("Sequential \"", this->name(), "\" has no layer named \"", name,
               "\" (layers: ", names, ")");
}

ReplicaGenerators& Sequential::generators() const { return model().generators(); }

}  // namespace tandem::nn
