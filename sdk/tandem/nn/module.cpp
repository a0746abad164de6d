// ModuleImpl (naming, build, input checks, weight creation) and the Module handle, including
// the Keras-style summary table.
#include "tandem/nn/module.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tandem/ops/ops.h"

namespace tandem::nn {

// ---- ModuleImpl ------------------------------------------------------------------------------

ModuleImpl::ModuleImpl(std::string default_name)
    : default_name_(default_name), name_(std::move(default_name)), policy_(global_policy()) {}

std::vector<Module> ModuleImpl::children() const { return children_; }

std::vector<Variable> ModuleImpl::weights() const {
  std::vector<Variable> out = weights_;
  for (const Module& child : children_) {
    const std::vector<Variable> w = child.weights();
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

void ModuleImpl::set_random_source(std::shared_ptr<ReplicaGenerators> source) {
  for (const Module& child : children_) child.impl().set_random_source(source);
}

void ModuleImpl::set_scope(std::string scope) {
  TANDEM_CHECK(!built(), describe(), ": its variables are named already (built)");
  scope_ = std::move(scope);
  scoped_ = true;
}

std::string ModuleImpl::child_scope() const {
  return scope_.empty() ? name_ : scope_ + "/" + name_;
}

void ModuleImpl::register_child(const Module& child) {
  TANDEM_CHECK(child.defined(), describe(), ": cannot add an undefined module");
  TANDEM_CHECK(!built(), describe(), ": add modules before it is built");
  ModuleImpl& impl = child.impl();
  TANDEM_CHECK(&impl != this, describe(), ": a module cannot contain itself");
  auto taken = [&](const std::string& name) {
    for (const Module& m : children_)
      if (m.name() == name) return true;
    return false;
  };
  for (const Module& m : children_)
    TANDEM_CHECK(m.ptr().get() != &impl, describe(), ": module \"", m.name(),
                 "\" was added twice; create a new one for each place");
  if (!impl.has_explicit_name() && !impl.built()) {
    std::string name = impl.default_name();
    for (int i = 1; taken(name); ++i) name = impl.default_name() + "_" + std::to_string(i);
    impl.set_auto_name(name);
  }
  TANDEM_CHECK(!taken(impl.name()), describe(), ": two modules are named \"", impl.name(),
               "\"; names must be unique within a block (call set_name before build)");
  children_.push_back(child);
}

std::string ModuleImpl::keras_child_key(const Module& child) const { return child.name(); }

Shape ModuleImpl::build_child(const Module& child, const Shape& input_shape, Generator& generator) {
  ModuleImpl& impl = child.impl();
  if (!impl.built()) impl.set_scope(child_scope());
  impl.build(input_shape, generator);
  return impl.output_shape();
}

namespace {
/// "[batch, 28, 28]" for a shape without its batch axis.
std::string with_batch(const Shape& shape) {
  std::string s = "[batch";
  for (int64_t d : shape) s += ", " + std::to_string(d);
  return s + "]";
}
}  // namespace

void ModuleImpl::check_input(const Tensor& x) const {
  const Shape& in = input_shape();
  bool ok = x.rank() == in.rank() + 1;
  for (int64_t i = 0; ok && i < in.rank(); ++i) ok = x.dim(i + 1) == in[i];
  TANDEM_CHECK(ok, describe(), " was built for inputs ", with_batch(in),
               " but got an input of shape ", x.shape());
}

void ModuleImpl::set_dtype(DType dtype) {
  TANDEM_CHECK(!built(), describe(), ": set_dtype after build (the variables exist already)");
  TANDEM_CHECK(is_floating(dtype), describe(), ": variables must be floating point, not ", dtype);
  policy_ = Policy::of(dtype);
  for (const Module& child : children_) child.impl().set_dtype(dtype);
}

std::string ModuleImpl::scoped_name(const std::string& short_name) const {
  return (scope_.empty() ? name_ : scope_ + "/" + name_) + "/" + short_name;
}

void ModuleImpl::set_dtype_policy(const Policy& policy) {
  TANDEM_CHECK(!built() || policy == policy_, describe(), ": set_dtype_policy(\"", policy.name(),
               "\") after build (its variables exist already, as ", policy_.variable_dtype(), ")");
  policy_ = policy;
}

Tensor ModuleImpl::autocast(const Tensor& t) const {
  const DType compute = policy_.compute_dtype();
  if (!t.defined() || t.dtype() == compute || !is_floating(t.dtype())) return t;
  return ops::cast(t, compute);
}

void ModuleImpl::set_name(std::string name) {
  TANDEM_CHECK(!name.empty(), describe(), ": a layer name cannot be empty");
  TANDEM_CHECK(name.find('/') == std::string::npos, describe(), ": layer name \"", name,
               "\" contains '/', which separates layer and variable in variable names");
  TANDEM_CHECK(!built() || name == name_, describe(), ": cannot rename to \"", name,
               "\" after build (its variables are named after it already)");
  name_ = std::move(name);
  explicit_name_ = true;
}

void ModuleImpl::set_auto_name(std::string name) {
  if (built() || explicit_name_) return;
  name_ = std::move(name);
}

const Shape& ModuleImpl::input_shape() const {
  TANDEM_CHECK(built(), describe(), " is not built yet: call build(input_shape) or run it once");
  return input_shape_;
}

const Shape& ModuleImpl::output_shape() const {
  TANDEM_CHECK(built(), describe(), " is not built yet: call build(input_shape) or run it once");
  return output_shape_;
}

void ModuleImpl::build(const Shape& input_shape, Generator& generator) {
  std::lock_guard<std::mutex> lock(build_mutex_);
  if (built()) {
    TANDEM_CHECK(input_shape == input_shape_, describe(), " was built for input shape ",
                 input_shape_, " (without batch); it cannot be built again for ", input_shape);
    return;
  }
  output_shape_ = compute_output_shape(input_shape);  // validates the input shape
  build_variables(input_shape, generator);
  input_shape_ = input_shape;
  built_.store(true, std::memory_order_release);
}

void ModuleImpl::build_variables(const Shape& input_shape, Generator& generator) {
  (void)input_shape;
  (void)generator;
}

Tensor ModuleImpl::forward(const Tensor& x, bool training) {
  TANDEM_CHECK(x.defined(), describe(), ": the input tensor is undefined");
  if (!built()) {
    TANDEM_CHECK(x.rank() >= 1, describe(), ": inputs need a leading batch axis, got shape ",
                 x.shape());
    std::vector<int64_t> dims(x.shape().begin() + 1, x.shape().end());
    Generator generator(seed_, kInitializerStream);
    build(Shape(std::move(dims)), generator);
  }
  check_input(x);
  return call(autocasts_inputs() ? autocast(x) : x, training);
}

Variable ModuleImpl::add_weight(const std::string& short_name, const Tensor& initial,
                                bool trainable) {
  Variable v = make_variable(scoped_name(short_name), initial, trainable);
  weights_.push_back(v);
  return v;
}

Variable ModuleImpl::add_weight(const std::string& short_name, const Tensor& initial,
                                const VariableOptions& options) {
  Variable v = make_variable(scoped_name(short_name), initial, options);
  weights_.push_back(v);
  return v;
}

std::string ModuleImpl::describe() const {
  return detail::str_cat("layer \"", name_, "\" (", type_name(), ")");
}

// ---- Module ----------------------------------------------------------------------------------

Module::Module(std::shared_ptr<ModuleImpl> impl) : impl_(std::move(impl)) {
  TANDEM_CHECK(impl_ != nullptr, "Module: null implementation");
}

ModuleImpl& Module::impl() const {
  TANDEM_CHECK(impl_ != nullptr, "use of an undefined nn::Module handle");
  return *impl_;
}

const std::string& Module::name() const { return impl().name(); }
void Module::set_name(std::string name) { impl().set_name(std::move(name)); }
std::string Module::type_name() const { return impl().type_name(); }

void Module::build(const Shape& input_shape) {
  Generator generator(impl().seed(), kInitializerStream);
  impl().build(input_shape, generator);
}

void Module::build(const Shape& input_shape, Generator& generator) {
  impl().build(input_shape, generator);
}

bool Module::built() const { return impl().built(); }
void Module::set_seed(uint64_t seed) { impl().set_seed(seed); }
uint64_t Module::seed() const { return impl().seed(); }
void Module::set_dtype(DType dtype) { impl().set_dtype(dtype); }
void Module::set_dtype_policy(const Policy& policy) { impl().set_dtype_policy(policy); }
const Policy& Module::dtype_policy() const { return impl().dtype_policy(); }

Tensor Module::operator()(const Tensor& x, bool training) const {
  return impl().forward(x, training);
}

const Shape& Module::input_shape() const { return impl().input_shape(); }
const Shape& Module::output_shape() const { return impl().output_shape(); }
std::vector<Variable> Module::weights() const { return impl().weights(); }

std::vector<Variable> Module::trainable_variables() const {
  std::vector<Variable> out;
  for (const Variable& v : weights())
    if (v.trainable()) out.push_back(v);
  return out;
}

std::vector<Variable> Module::non_trainable_variables() const {
  std::vector<Variable> out;
  for (const Variable& v : weights())
    if (!v.trainable()) out.push_back(v);
  return out;
}

int64_t Module::count_params() const {
  int64_t n = 0;
  for (const Variable& v : weights()) n += v.value_untracked().numel();
  return n;
}

std::vector<Module> Module::children() const { return impl().children(); }

// ---- summary ---------------------------------------------------------------------------------

namespace {

/// 235146 -> "235,146".
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

/// Keras' readable_memory_size: "918.54 KB".
std::string readable_size(double bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (unit < 5 && bytes / 1024.0 >= 1.0) {
    bytes /= 1024.0;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.2f %s", bytes, kUnits[unit]);
  return buffer;
}

std::string output_shape_text(const Module& m) {
  if (!m.built()) return "?";
  std::string s = "(None";
  for (int64_t d : m.output_shape()) s += ", " + std::to_string(d);
  return s + ")";
}

/// Number of characters a UTF-8 string shows as (the table is drawn with box characters).
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

std::string repeat(const std::string& unit, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += unit;
  return out;
}

std::string pad_right(const std::string& s, size_t width) {
  return s + std::string(width > display_width(s) ? width - display_width(s) : 0, ' ');
}

std::string pad_left(const std::string& s, size_t width) {
  return std::string(width > display_width(s) ? width - display_width(s) : 0, ' ') + s;
}

}  // namespace

std::string Module::summary() const {
  struct Row {
    std::string layer, shape, params;
  };
  std::vector<Module> rows_of = children();
  const bool is_model = !rows_of.empty() || type_name() == "Sequential";
  if (!is_model) rows_of = {*this};
  std::vector<Row> rows;
  for (const Module& m : rows_of) {
    rows.push_back({m.name() + " (" + m.type_name() + ")", output_shape_text(m),
                    m.built() ? with_commas(m.count_params()) : "0 (unbuilt)"});
  }
  // Keras' default column widths, widened when a cell needs more.
  size_t w0 = 31, w1 = 22, w2 = 13;
  for (const Row& r : rows) {
    w0 = std::max(w0, display_width(r.layer));
    w1 = std::max(w1, display_width(r.shape));
    w2 = std::max(w2, display_width(r.params));
  }
  auto line = [&](const char* left, const char* fill, const char* mid, const char* right) {
    return std::string(left) + repeat(fill, w0 + 2) + mid + repeat(fill, w1 + 2) + mid +
           repeat(fill, w2 + 2) + right + "\n";
  };
  std::ostringstream out;
  out << (is_model ? "Model: \"" : "Layer: \"") << name() << "\"\n";
  out << line("┏", "━", "┳", "┓");
  out << "┃ " << pad_right("Layer (type)", w0) << " ┃ " << pad_right("Output Shape", w1) << " ┃ "
      << pad_left("Param #", w2) << " ┃\n";
  out << line("┡", "━", "╇", "┩");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) out << line("├", "─", "┼", "┤");
    out << "│ " << pad_right(rows[i].layer, w0) << " │ " << pad_right(rows[i].shape, w1) << " │ "
        << pad_left(rows[i].params, w2) << " │\n";
  }
  out << line("└", "─", "┴", "┘");
  int64_t trainable = 0, non_trainable = 0;
  double trainable_bytes = 0, non_trainable_bytes = 0;
  for (const Variable& v : weights()) {
    const Tensor& t = v.value_untracked();
    const double bytes = static_cast<double>(t.nbytes());
    if (v.trainable()) {
      trainable += t.numel();
      trainable_bytes += bytes;
    } else {
      non_trainable += t.numel();
      non_trainable_bytes += bytes;
    }
  }
  out << " Total params: " << with_commas(trainable + non_trainable) << " ("
      << readable_size(trainable_bytes + non_trainable_bytes) << ")\n";
  out << " Trainable params: " << with_commas(trainable) << " (" << readable_size(trainable_bytes)
      << ")\n";
  out << " Non-trainable params: " << with_commas(non_trainable) << " ("
      << readable_size(non_trainable_bytes) << ")\n";
  return out.str();
}

}  // namespace tandem::nn
