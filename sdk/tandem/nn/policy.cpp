// Dtype policies and the global policy.
#include "tandem/nn/policy.h"

#include <mutex>

#include "tandem/core/cpu_isa.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::nn {

namespace {

std::mutex& global_mutex() {
  static std::mutex mutex;
  return mutex;
}

Policy& global() {
  static Policy policy("float32");
  return policy;
}

/// Says once per process and dtype what the CPU does with it where it has no fast 16-bit
/// instructions.
void say_when_slow(DType compute) {
  static std::once_flag bf16_said, f16_said;
  if (compute == DType::kBFloat16 && !cpu_has_bfloat16_instructions()) {
    std::call_once(bf16_said, [] {
      TANDEM_LOG_INFO(
          "dtype policy mixed_bfloat16 on a CPU without bfloat16 instructions (",
          cpu_isa_name(cpu_isa()),
          "; AVX512-BF16 or AMX make them): the GEMMs and convolutions widen their bfloat16 "
          "operands to float32 and compute there, so the step runs somewhat slower than "
          "float32 (the conversions), with bfloat16 activations (half the memory) and bfloat16 "
          "rounding between layers; float32 is the faster policy on this CPU");
    });
  } else if (compute == DType::kFloat16) {
    std::call_once(f16_said, [] {
      TANDEM_LOG_WARNING(
          "dtype policy mixed_float16: on the CPU float16 is emulated (widened to float32 and "
          "rounded back), so it saves no time there; mixed_bfloat16 is the CPU's fast 16-bit "
          "type. float16 gradients need loss scaling to keep small values from flushing to zero");
    });
  }
}

}  // namespace

Policy::Policy(std::string_view name) : name_(name) {
  if (name == "float32") {
    variable_dtype_ = compute_dtype_ = DType::kFloat32;
  } else if (name == "float64") {
    variable_dtype_ = compute_dtype_ = DType::kFloat64;
  } else if (name == "mixed_bfloat16") {
    variable_dtype_ = DType::kFloat32;
    compute_dtype_ = DType::kBFloat16;
    say_when_slow(compute_dtype_);
  } else if (name == "mixed_float16") {
    variable_dtype_ = DType::kFloat32;
    compute_dtype_ = DType::kFloat16;
    say_when_slow(compute_dtype_);
  } else {
    TANDEM_THROW("dtype policy \"", name,
                 "\" is not one of \"float32\", \"float64\", \"mixed_bfloat16\", "
                 "\"mixed_float16\"");
  }
}

Policy Policy::of(DType dtype) {
  TANDEM_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat64, "dtype policy for ", dtype,
               ": variables are float32 or float64 (for 16-bit compute, use \"mixed_bfloat16\" "
               "or \"mixed_float16\")");
  return Policy(dtype_name(dtype));
}

void set_global_policy(const Policy& policy) {
  std::lock_guard<std::mutex> lock(global_mutex());
  global() = policy;
}

void set_global_policy(std::string_view name) { set_global_policy(Policy(name)); }

Policy global_policy() {
  std::lock_guard<std::mutex> lock(global_mutex());
  return global();
}

bool cpu_has_bfloat16_instructions() { return cpu_isa() >= CpuIsa::kAvx512CoreBf16; }

}  // namespace tandem::nn
