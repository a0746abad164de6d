// Dtype policies, with Keras's names and rules (keras.mixed_precision): the dtype a layer's
// variables are created in and the dtype it computes in. Under "mixed_bfloat16" or
// "mixed_float16" variables stay float32 (the master weights the optimizer updates); a layer
// casts its floating inputs and its variables to the 16-bit compute dtype, so the gradients
// come back float32; losses compute in float32.
#pragma once

#include <string>
#include <string_view>

#include "tandem/core/dtype.h"

namespace tandem::nn {

/// A dtype policy (keras.mixed_precision.Policy): the dtype a layer's variables are created in
/// and the dtype it computes in. Compared by name.
class Policy {
 public:
  /// "float32" (the default), "float64", "mixed_bfloat16" or "mixed_float16"; raises naming
  /// any other name.
  explicit Policy(std::string_view name = "float32");
  /// The policy that creates and computes in `dtype` ("float32" or "float64").
  static Policy of(DType dtype);

  /// The policy's Keras name ("mixed_bfloat16").
  const std::string& name() const { return name_; }
  /// The dtype variables are created in.
  DType variable_dtype() const { return variable_dtype_; }
  /// The dtype the layer computes in (its outputs' dtype).
  DType compute_dtype() const { return compute_dtype_; }
  /// True when the two differ (a mixed precision policy).
  bool is_mixed() const { return variable_dtype_ != compute_dtype_; }

  friend bool operator==(const Policy& a, const Policy& b) { return a.name_ == b.name_; }

 private:
  std::string name_;
  DType variable_dtype_;
  DType compute_dtype_;
};

/// The policy layers take when they are constructed (keras.mixed_precision.set_global_policy):
/// set it before making the model. A layer keeps its own policy afterwards
/// (Module::set_dtype_policy changes one layer's). The first 16-bit policy of a process says
/// once, in the log, what this CPU does with that dtype when it has no fast instructions for it
/// (bfloat16 without AVX512-BF16 or AMX: the GEMMs and convolutions compute in float32 from
/// widened operands; float16 is always emulated on the CPU).
void set_global_policy(const Policy& policy);
/// The same by name ("mixed_bfloat16"); raises for an unknown name.
void set_global_policy(std::string_view name);
/// The current global policy ("float32" unless set).
Policy global_policy();

/// Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16) and
/// TANDEM_MAX_CPU_ISA lets the kernels use them (cpu_isa() >= kAvx512CoreBf16).
bool cpu_has_bfloat16_instructions();

}  // namespace tandem::nn
