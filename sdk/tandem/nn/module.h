// Module: the handle every layer and model is used through (Keras-style names, variables,
// build, call, summary), and ModuleImpl, the base class that layer implementations derive from.
// The split follows PyTorch's C++ frontend (Linear holds a LinearImpl): handles are cheap to
// copy, so layers go into Sequential's initializer list by value and still alias one layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/shape.h"
#include "tandem/nn/policy.h"
#include "tandem/nn/replica_state.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"

namespace tandem::nn {

class Module;

/// The seed a module initialises its weights from when set_seed() was never called. Defaults
/// are deterministic: two models built the same way start identical.
inline constexpr uint64_t kDefaultSeed = 0;
/// The Philox stream weight initialisers draw from (dropout uses streams 1 + replica id).
inline constexpr uint64_t kInitializerStream = 0;

/// What a layer is made of. Derive from it to write a layer: implement type_name(),
/// compute_output_shape(), call(), and build_variables() when the layer has weights (create
/// them with add_weight()). Then wrap it in a Module (or a handle class deriving from Module).
class ModuleImpl {
 public:
  virtual ~ModuleImpl() = default;
  ModuleImpl(const ModuleImpl&) = delete;
  ModuleImpl& operator=(const ModuleImpl&) = delete;

  /// Keras class name: "Dense", "Conv2D", "MaxPooling2D", "Flatten", "Dropout", "Sequential".
  virtual std::string type_name() const = 0;
  /// Output shape without the batch axis for an input shape without it; raises (naming the
  /// layer and the shape) when the layer cannot take that input.
  virtual Shape compute_output_shape(const Shape& input_shape) const = 0;
  /// The forward pass of a built module; x has a leading batch axis.
  virtual Tensor call(const Tensor& x, bool training) = 0;
  /// Sub-modules (a Sequential's layers, a block's add_child() modules); empty for plain layers.
  virtual std::vector<Module> children() const;
  /// Every variable, in Keras order (kernel, then bias; a model lists its layers in order): the
  /// module's own, then its add_child() modules' in the order they were added.
  virtual std::vector<Variable> weights() const;
  /// Raises unless x (with batch) fits the built input shape. Default: the same rank and the
  /// same dimensions after the batch axis.
  virtual void check_input(const Tensor& x) const;

  /// dtype of the variables created at build, and of the computation (default float32); set
  /// before build. The same as set_dtype_policy(Policy::of(dtype)).
  virtual void set_dtype(DType dtype);
  /// The layer's dtype policy (taken from nn::global_policy() when the layer was made); set
  /// before build.
  void set_dtype_policy(const Policy& policy);
  /// The layer's dtype policy (float32 unless set or taken from the global policy).
  const Policy& dtype_policy() const { return policy_; }
  /// The dtype the layer computes in: its floating inputs and variables are cast to it.
  DType compute_dtype() const { return policy_.compute_dtype(); }
  /// Seed of the generator Module::build(shape) creates (stream kInitializerStream).
  virtual void set_seed(uint64_t seed) { seed_ = seed; }
  /// The per-replica random streams that stochastic layers draw from (Sequential shares its
  /// own with every layer it holds). Default: handed to the add_child() modules.
  virtual void set_random_source(std::shared_ptr<ReplicaGenerators> source);

  /// The layer's name ("dense_1"): given by set_name(), by its model, or default_name().
  const std::string& name() const { return name_; }
  /// The Keras auto-name prefix ("dense", "conv2d", "max_pooling2d", ...).
  const std::string& default_name() const { return default_name_; }
  /// Gives the module a name chosen by the user (kept when it joins a Sequential).
  void set_name(std::string name);
  /// Gives the module a name chosen by its model (Keras auto-naming).
  void set_auto_name(std::string name);
  /// True when set_name() named the module (its model then keeps that name).
  bool has_explicit_name() const { return explicit_name_; }
  /// The dtype of the layer's variables (dtype_policy().variable_dtype()).
  DType dtype() const { return policy_.variable_dtype(); }
  /// The seed set by set_seed() (kDefaultSeed unless set).
  uint64_t seed() const { return seed_; }

  /// True once build() has created the variables.
  bool built() const { return built_.load(std::memory_order_acquire); }
  /// Input and output shapes without the batch axis (valid once built).
  const Shape& input_shape() const;
  /// See input_shape().
  const Shape& output_shape() const;

  /// Creates the variables for inputs of `input_shape` (without batch), drawing initial values
  /// from `generator`. Building again with the same shape is a no-op; another shape raises.
  void build(const Shape& input_shape, Generator& generator);
  /// Checks x, builds on first use (from x's shape and a generator seeded with seed()), casts
  /// a floating x to compute_dtype() (Keras's autocast; a Sequential leaves that to its
  /// layers), and runs call(). Thread safe once built (replicas call concurrently).
  Tensor forward(const Tensor& x, bool training);

 protected:
  /// `default_name` is the Keras auto-name prefix ("dense"), also the name until one is given.
  explicit ModuleImpl(std::string default_name);
  /// Creates this module's variables; called once, by build().
  virtual void build_variables(const Shape& input_shape, Generator& generator);
  /// Creates the variable "<name>/<short_name>" through tandem::make_variable (the one place
  /// variables are made, so strategy scopes can mirror them) and appends it to weights().
  Variable add_weight(const std::string& short_name, const Tensor& initial, bool trainable = true);
  /// The same with a synchronization and aggregation (batch norm's moving statistics are
  /// {.trainable = false, .synchronization = kOnRead, .aggregation = kMean}).
  Variable add_weight(const std::string& short_name, const Tensor& initial,
                      const VariableOptions& options);
  /// "<scope>/<name>/<short_name>" ("<name>/<short_name>" at a model's top level).
  std::string scoped_name(const std::string& short_name) const;
  /// "layer \"dense_1\" (Dense)", for error messages.
  std::string describe() const;
  /// t cast to compute_dtype() when it is floating and of another dtype (recorded: a variable's
  /// gradient comes back in the variable's dtype); else t itself. call() reads variables
  /// through it.
  Tensor autocast(const Tensor& t) const;
  /// Whether forward() casts the input (false for containers, whose layers do it).
  virtual bool autocasts_inputs() const { return true; }

 public:
  /// The path a containing module gives this one's variable names ("" at the top of a model):
  /// its variables are "<scope>/<name>/<short name>". Set by the container before it builds
  /// this module (build_child, Sequential).
  void set_scope(std::string scope);
  /// The path set by set_scope() ("" until then).
  const std::string& scope() const { return scope_; }
  /// True once a containing module set the scope (the module is not a model's top).
  bool is_scoped() const { return scoped_; }
  /// The scope this module gives the modules it contains: "" for a top-level Sequential (its
  /// layers keep Keras's flat names, "dense/kernel"), else "<scope>/<name>".
  virtual std::string child_scope() const;
  /// The key a Keras 3 .weights.h5 file keeps the add_child() module `child` under (the
  /// attribute holding it in the Keras layer): its name by default. Keras's MultiHeadAttention
  /// names its projections "query" but keeps them as "query_dense".
  virtual std::string keras_child_key(const Module& child) const;

 protected:
  /// A block of your own holds its sub-modules by adding them here (in its constructor):
  /// each gets a Keras auto-name unique among the block's children unless named explicitly,
  /// the block's random streams, and a place in children() and weights(). Returns `child`.
  template <typename M>
  M add_child(M child) {
    register_child(child);
    return child;
  }
  /// The same, naming the child (as a Keras layer's attribute, or a PyTorch register_module
  /// name): its variables become "<block>/<name>/<weight>", and a Keras 3 .weights.h5 file of
  /// the block keeps its weights under that name ("residual_block/conv1/vars"), so
  /// load_weights finds them.
  template <typename M>
  M add_child(const std::string& name, M child) {
    child.set_name(name);
    register_child(child);
    return child;
  }
  /// Builds an add_child() module for `input_shape` under this block's scope (call it from
  /// build_variables, in the order the block uses them); returns its output shape.
  Shape build_child(const Module& child, const Shape& input_shape, Generator& generator);

 private:
  void register_child(const Module& child);

  std::string default_name_;
  std::string name_;
  bool explicit_name_ = false;
  Policy policy_;
  uint64_t seed_ = kDefaultSeed;
  std::atomic<bool> built_{false};
  Shape input_shape_;
  Shape output_shape_;
  std::vector<Variable> weights_;
  std::vector<Module> children_;
  std::string scope_;
  bool scoped_ = false;  // a container set the scope (this module is not a model's top)
  std::mutex build_mutex_;
};

/// A handle to a layer or model. Copies alias the same module (like Variable and Tensor).
class Module {
 public:
  /// An undefined handle.
  Module() = default;
  /// Wraps an implementation (how custom layers become Modules).
  explicit Module(std::shared_ptr<ModuleImpl> impl);

  /// False for a default-constructed handle.
  bool defined() const { return impl_ != nullptr; }
  /// Keras layer name ("dense", "dense_1", ...): auto-assigned by the Sequential the layer is
  /// added to, "<prefix>" for a standalone layer, or the name given with set_name().
  const std::string& name() const;
  /// Names the module (before it is built; names must be unique within a model).
  void set_name(std::string name);
  /// Keras class name ("Dense", "Conv2D", "MaxPooling2D", ...).
  std::string type_name() const;

  /// Builds for inputs of `input_shape` (without the batch axis), initialising weights from
  /// Generator(seed(), kInitializerStream). One seed, one model: building two models with the
  /// same layers and seed gives identical weights.
  void build(const Shape& input_shape);
  /// The same, drawing initial values from `generator` (advanced as values are drawn).
  void build(const Shape& input_shape, Generator& generator);
  /// True once the module's variables exist (after build() or the first call).
  bool built() const;
  /// Seeds weight initialisation (and, for a Sequential, its dropout streams). Before build.
  void set_seed(uint64_t seed);
  /// The seed weights are initialised from (kDefaultSeed unless set).
  uint64_t seed() const;
  /// dtype of the variables and the computation (default float32; float64 for gradient
  /// checks). Before build. A Sequential sets it on every layer.
  void set_dtype(DType dtype);
  /// This module's dtype policy: "float32", "float64", "mixed_bfloat16", "mixed_float16" (Keras's
  /// `dtype=` argument of a layer). Before build. Layers take nn::global_policy() when made; a
  /// Sequential's own policy does not change its layers'.
  void set_dtype_policy(const Policy& policy);
  /// The same by name ("mixed_bfloat16"); raises for an unknown name.
  void set_dtype_policy(std::string_view name) { set_dtype_policy(Policy(name)); }
  /// The module's dtype policy.
  const Policy& dtype_policy() const;

  /// Runs the module on x (leading batch axis); builds it first if needed. `training` turns
  /// dropout on. Records on active gradient tapes.
  Tensor operator()(const Tensor& x, bool training = false) const;

  /// Shapes without the batch axis (valid once built).
  const Shape& input_shape() const;
  /// See input_shape().
  const Shape& output_shape() const;
  /// Every variable in Keras order (per layer: kernel, bias).
  std::vector<Variable> weights() const;
  /// The weights() that an optimizer updates (batch norm's moving statistics are not).
  std::vector<Variable> trainable_variables() const;
  /// The other weights() (batch norm's moving mean and variance).
  std::vector<Variable> non_trainable_variables() const;
  /// Number of scalars in weights().
  int64_t count_params() const;
  /// Sub-modules (a Sequential's layers).
  std::vector<Module> children() const;

  /// A Keras-style table: "Layer (type)", "Output Shape", "Param #", then Total /
  /// Trainable / Non-trainable params with their sizes. Print it: std::cout << m.summary().
  std::string summary() const;

  /// The implementation; raises on an undefined handle.
  ModuleImpl& impl() const;
  /// The shared implementation pointer (null for an undefined handle).
  const std::shared_ptr<ModuleImpl>& ptr() const { return impl_; }
  /// This module as the handle type `Handle` (e.g. model.children()[1].as<Dense>()); raises
  /// when the module is of another type.
  template <typename Handle>
  Handle as() const;

  /// True when both handles alias the same module.
  friend bool operator==(const Module& a, const Module& b) { return a.impl_ == b.impl_; }

 protected:
  /// The module this handle aliases (null when undefined).
  std::shared_ptr<ModuleImpl> impl_;
};

template <typename Handle>
Handle Module::as() const {
  auto p = std::dynamic_pointer_cast<typename Handle::Impl>(impl_);
  TANDEM_CHECK(p != nullptr, "Module \"", defined() ? name() : std::string("<undefined>"),
               "\" is a ", defined() ? type_name() : std::string("<undefined>"),
               ", not the requested layer type");
  return Handle(std::move(p));
}

}  // namespace tandem::nn
