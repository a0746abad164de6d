// The engine, attributes and execution of oneDNN primitives (ops/cpu/onednn.h). Built only with
// oneDNN (CMakeLists.txt leaves onednn*.cpp out otherwise).
#include "tandem/ops/cpu/onednn.h"

#include <dnnl_debug.h>
#include <omp.h>

#include <vector>

#include "tandem/core/cpu_isa.h"
#include "tandem/core/logging.h"

namespace tandem::ops::cpu::onednn {
namespace {

/// `bytes` of `buffer`, grown as needed, from an address aligned for vector loads.
void* aligned(std::vector<std::byte>& buffer, size_t bytes) {
  constexpr size_t kAlign = 64;
  if (buffer.size() < bytes + kAlign) buffer.resize(bytes + kAlign);
  void* p = buffer.data();
  size_t space = buffer.size();
  return std::align(kAlign, bytes, p, space);
}

/// The calling thread's scratchpad.
void* scratchpad(size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  return aligned(buffer, bytes);
}

}  // namespace

void* weights_buffer(size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  return aligned(buffer, bytes);
}

void apply_cpu_isa_cap() {
  static const bool applied = [] {
    if (!cpu_isa_capped()) return false;
    dnnl_cpu_isa_t isa = dnnl_cpu_isa_avx2;
    switch (cpu_isa()) {
      case CpuIsa::kAvx512Core:
        isa = dnnl_cpu_isa_avx512_core;
        break;
      case CpuIsa::kAvx512CoreBf16:
        isa = dnnl_cpu_isa_avx512_core_bf16;
        break;
      case CpuIsa::kAvx512CoreAmx:
        isa = dnnl_cpu_isa_avx512_core_amx;
        break;
      default:
        break;  // a cap is at least avx2
    }
    const dnnl_status_t status = dnnl_set_max_cpu_isa(isa);
    if (status != dnnl_success)
      TANDEM_LOG_WARNING("TANDEM_MAX_CPU_ISA=", cpu_isa_name(cpu_isa()),
                         ": oneDNN did not take the cap (", dnnl_status2str(status),
                         "; ONEDNN_MAX_CPU_ISA set too?), so its kernels may use more");
    return status == dnnl_success;
  }();
  (void)applied;
}

int team_threads() {
  const int threads = omp_get_max_threads();
  const int limit = omp_get_thread_limit();
  if (limit >= 1 && threads > limit) {
    omp_set_num_threads(limit);
    return limit;
  }
  return threads;
}

const dnnl::engine& engine() {
  static const dnnl::engine cpu = [] {
    apply_cpu_isa_cap();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return cpu;
}

dnnl::primitive_attr attributes(bool relu) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu) {
    dnnl::post_ops post_ops;
    post_ops.append_eltwise(/*scale=*/1.0f, dnnl::algorithm::eltwise_relu, /*alpha=*/0.0f,
                            /*beta=*/0.0f);
    attr.set_post_ops(post_ops);
  }
  return attr;
}

void execute(const dnnl::primitive& primitive, std::unordered_map<int, dnnl::memory> args,
             size_t scratchpad_bytes) {
  if (scratchpad_bytes > 0) {
    const dnnl::memory::desc pad({static_cast<int64_t>(scratchpad_bytes)},
                                 dnnl::memory::data_type::u8, dnnl::memory::format_tag::a);
    args.emplace(DNNL_ARG_SCRATCHPAD, wrap(pad, scratchpad(scratchpad_bytes)));
  }
  dnnl::stream stream(engine());
  primitive.execute(stream, args);
  stream.wait();
}

}  // namespace tandem::ops::cpu::onednn
