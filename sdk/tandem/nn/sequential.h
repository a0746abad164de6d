// Sequential: a model that runs its layers one after the other (Keras Sequential), names them
// the Keras way (dense, dense_1, conv2d, ...) and owns the dropout streams of its layers.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tandem/nn/module.h"

namespace tandem::nn {

/// Sequential's implementation.
class SequentialImpl : public ModuleImpl {
 public:
  /// See Sequential's constructor.
  explicit SequentialImpl(std::vector<Module> layers);
  std::string type_name() const override { return "Sequential"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
  /// Each layer checks its own input.
  void check_input(const Tensor& x) const override { (void)x; }
  std::vector<Module> children() const override { return layers_; }
  /// "" at a model's top (its layers keep Keras's flat names); nested, "<scope>/<name>".
  std::string child_scope() const override;
  std::vector<Variable> weights() const override;
  void set_dtype(DType dtype) override;
  /// The layers cast their own inputs (each to its policy's compute dtype).
  bool autocasts_inputs() const override { return false; }
  /// Seeds weight initialisation and reseeds the dropout streams.
  void set_seed(uint64_t seed) override;
  /// A nested Sequential adopts its parent's streams (and hands them to its layers).
  void set_random_source(std::shared_ptr<ReplicaGenerators> source) override;

  /// Appends a layer, giving it the next free Keras auto-name unless it was named explicitly.
  void add(Module layer);
  /// The per-replica dropout streams the model's layers share.
  ReplicaGenerators& generators() const { return *generators_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  std::vector<Module> layers_;
  std::shared_ptr<ReplicaGenerators> generators_;
};

/// A stack of layers: Sequential model({Flatten(), Dense(256, Activation::kRelu), Dense(10)});
/// model.build({28, 28}); Tensor logits = model(x, /*training=*/true);
///
/// Weights are initialised from Generator(seed, kInitializerStream), consumed layer by layer
/// in order (set_seed before build; default kDefaultSeed), so one seed gives one model.
/// Dropout layers draw from generators(): replica r uses Generator(seed, 1 + r).
class Sequential : public Module {
 public:
  /// The implementation class (what Module::as<Sequential>() casts to).
  using Impl = SequentialImpl;
  /// A model of `layers`, run in order: `Sequential({Flatten(), Dense(10)})`.
  Sequential(std::initializer_list<Module> layers);
  /// The same from a vector; empty by default (add layers with add()).
  explicit Sequential(std::vector<Module> layers = {});
  /// Wraps an existing implementation (another handle to the same model).
  explicit Sequential(std::shared_ptr<SequentialImpl> impl);

  /// Appends a layer (before build).
  void add(Module layer);
  /// The layers, in order (handles: they alias the model's layers).
  std::vector<Module> layers() const { return children(); }
  /// Layer `index` in order; raises when out of range.
  Module layer(size_t index) const;
  /// The layer named `name`; raises listing the names when there is none.
  Module get_layer(const std::string& name) const;
  /// The per-replica dropout streams (their states go into checkpoints).
  ReplicaGenerators& generators() const;

 private:
  SequentialImpl& model() const { return static_cast<SequentialImpl&>(impl()); }
};

}  // namespace tandem::nn
