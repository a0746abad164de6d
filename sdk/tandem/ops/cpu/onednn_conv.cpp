// float32 and bfloat16 convolutions on oneDNN's primitives: the forward with the bias and the ReLU
// applied to the accumulator, backward-weights (with the bias gradient) and backward-data.
// Activations stay NHWC, which the primitives read and write directly. The kernel is reordered
// between HWIO and the blocked layout each primitive chooses: a copy of a few KiB per call, against
// jit kernels two to four times faster than the GEMM-based ones oneDNN runs on an HWIO kernel
// (measured on fashion_mnist_cnn's two layers, batch 64, 2 threads: forward + backward 7.2 ms
// -> 2.5 ms for the second layer). 3x3 stride-1 SAME float32 convolutions whose channel counts
// are multiples of 16 run oneDNN's Winograd kernels instead (see "Winograd" below).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "tandem/core/cpu_isa.h"
#include "tandem/core/error.h"
#include "tandem/ops/cpu/conv.h"
#include "tandem/ops/cpu/onednn.h"
#include "tandem/tensor/allocator.h"

namespace tandem::ops::cpu::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

/// What a cached primitive was made for (see PrimitiveCache).
struct ConvKey {
  ConvGeometry g;
  int64_t filters;
  bool bias, relu;
  int threads;
  dt type;        // of every tensor of the call (f32 or bf16); bfloat16 accumulates in float32
  bool winograd;  // Winograd kernels on blocked activations (see "Winograd" below)

  std::array<int64_t, 18> fields() const {
    return {g.batch,
            g.in_h,
            g.in_w,
            g.channels,
            g.window_h,
            g.window_w,
            g.stride_h,
            g.stride_w,
            g.pad_top,
            g.pad_left,
            g.out_h,
            g.out_w,
            filters,
            bias,
            relu,
            threads,
            static_cast<int64_t>(type),
            winograd};
  }
  bool operator==(const ConvKey& other) const { return fields() == other.fields(); }
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& key) const { return hash_values(key.fields()); }
};

bool winograd_applies(dt type, const ConvGeometry& g, int64_t filters);

ConvKey make_key(dt type, const ConvGeometry& g, int64_t filters, bool bias, bool relu) {
  return {g, filters, bias, relu, onednn::team_threads(), type, winograd_applies(type, g, filters)};
}

/// Padding after the input that makes oneDNN's output size the op's: TensorFlow's SAME puts the
/// odd row or column after; VALID drops what does not fill a window, which is no padding.
int64_t padding_after(int64_t input, int64_t window, int64_t stride, int64_t before,
                      int64_t output) {
  return std::max<int64_t>((output - 1) * stride + window - input - before, 0);
}

// ---- Winograd -----------------------------------------------------------------------------
//
// oneDNN's Winograd F(4x4, 3x3) kernels (jit_wino_4x3) multiply 2.25x less than the direct ones
// and took 25-35% less time for each of the three primitives on the ResNet sample's 3x3 layers
// (batch 64, 2 threads, 2-core AMD EPYC). They take 3x3, stride 1, SAME (padding 1) float32
// convolutions with channel counts that are multiples of 16, and read and write activations
// blocked by 16 channels (nChw16c): with 16 channels that lies in memory as NHWC does, so the
// data is used in place; with more, it is reordered into memory of the CPU allocator for the
// call and back (~0.02 ms for [64, 14, 14, 32]). Their rounding differs from the direct kernels';
// ops::set_winograd_convolutions(false) (or TANDEM_CONV_WINOGRAD=0) turns them off. Where
// oneDNN makes no Winograd primitive for a shape, the direct one runs (ConvKey::winograd off).

bool winograd_applies(dt type, const ConvGeometry& g, int64_t filters) {
  return type == dt::f32 && g.window_h == 3 && g.window_w == 3 && g.stride_h == 1 &&
         g.stride_w == 1 && g.pad_top == 1 && g.pad_left == 1 && g.out_h == g.in_h &&
         g.out_w == g.in_w && g.channels % 16 == 0 && filters % 16 == 0 && winograd_convolutions();
}

/// An activation [N, H, W, C]: as the op holds it (NHWC) and as the primitive reads or writes it
/// (`layout`), with the reorders between the two where they lie differently in memory (the
/// direct kernels take NHWC itself; nChw16c at 16 channels lies as NHWC does).
struct Activation {
  dnnl::memory::desc nhwc, layout;
  bool in_place = true;
  dnnl::reorder to_layout, to_nhwc;
  size_t scratchpad_bytes = 0;
};

Activation make_activation(const dnnl::memory::desc& nhwc, bool blocked) {
  Activation a;
  a.nhwc = a.layout = nhwc;
  if (!blocked) return a;
  a.layout = dnnl::memory::desc(nhwc.dims(), nhwc.data_type(), tag::nChw16c);
  a.in_place = nhwc.dims()[1] == 16;
  if (!a.in_place) {
    const dnnl::reorder::primitive_desc there(engine(), a.nhwc, engine(), a.layout, attributes());
    const dnnl::reorder::primitive_desc back(engine(), a.layout, engine(), a.nhwc, attributes());
    a.to_layout = dnnl::reorder(there);
    a.to_nhwc = dnnl::reorder(back);
    a.scratchpad_bytes =
        std::max(there.scratchpad_desc().get_size(), back.scratchpad_desc().get_size());
  }
  return a;
}

/// Memory of the CPU allocator for one call: its free lists serve a training step's repeated
/// calls without system calls, and the memory goes back to tensors between calls.
class CallBuffer {
 public:
  CallBuffer() = default;
  CallBuffer(const CallBuffer&) = delete;
  CallBuffer& operator=(const CallBuffer&) = delete;
  ~CallBuffer() {
    if (data_ != nullptr) cpu_allocator().deallocate(data_, bytes_);
  }
  void* get(size_t bytes) {
    TANDEM_CHECK(data_ == nullptr, "conv2d: a call buffer taken twice");
    bytes_ = bytes;
    data_ = cpu_allocator().allocate(bytes);
    return data_;
  }

 private:
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

/// An input activation as the primitive reads it: `data` itself, or its copy in `copy`.
dnnl::memory input(const Activation& a, const void* data, CallBuffer& copy) {
  if (a.in_place) return wrap(a.layout, data);
  void* copied = copy.get(a.layout.get_size());
  execute(a.to_layout, {{DNNL_ARG_FROM, wrap(a.nhwc, data)}, {DNNL_ARG_TO, wrap(a.layout, copied)}},
          a.scratchpad_bytes);
  return wrap(a.layout, copied);
}

/// Where the primitive writes an output activation: `data` itself, or `copy`, which
/// finish_output then reorders into `data`.
dnnl::memory output(const Activation& a, void* data, CallBuffer& copy) {
  return wrap(a.layout, a.in_place ? data : copy.get(a.layout.get_size()));
}

void finish_output(const Activation& a, const dnnl::memory& written, void* data) {
  if (a.in_place) return;
  execute(a.to_nhwc, {{DNNL_ARG_FROM, written}, {DNNL_ARG_TO, wrap(a.nhwc, data)}},
          a.scratchpad_bytes);
}

// ---- shapes and descriptions ----------------------------------------------------------------

/// The memory descriptors and window of a convolution. oneDNN lists dimensions logically
/// (N, C, H, W for activations, O, I, H, W for kernels); the format tags say how they lie.
struct ConvShapes {
  Activation src, dst;
  dnnl::memory::desc bias, kernel, any_kernel;
  dnnl::memory::dims strides, padding_before, padding_after;
  dnnl::algorithm algorithm;
};

ConvShapes shapes(const ConvKey& key) {
  const ConvGeometry& g = key.g;
  ConvShapes s;
  s.src = make_activation(
      dnnl::memory::desc({g.batch, g.channels, g.in_h, g.in_w}, key.type, tag::nhwc), key.winograd);
  s.dst = make_activation(
      dnnl::memory::desc({g.batch, key.filters, g.out_h, g.out_w}, key.type, tag::nhwc),
      key.winograd);
  const dnnl::memory::dims kernel{key.filters, g.channels, g.window_h, g.window_w};
  s.kernel = dnnl::memory::desc(kernel, key.type, tag::hwio);
  s.any_kernel = dnnl::memory::desc(kernel, key.type, tag::any);
  if (key.bias) s.bias = dnnl::memory::desc({key.filters}, key.type, tag::a);
  s.strides = {g.stride_h, g.stride_w};
  s.padding_before = {g.pad_top, g.pad_left};
  s.padding_after = {padding_after(g.in_h, g.window_h, g.stride_h, g.pad_top, g.out_h),
                     padding_after(g.in_w, g.window_w, g.stride_w, g.pad_left, g.out_w)};
  s.algorithm =
      key.winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  return s;
}

/// The forward primitive's description: the backward ones are made from it (as a hint).
dnnl::convolution_forward::primitive_desc forward_desc(const ConvShapes& s, bool bias,
                                                       const dnnl::primitive_attr& attr) {
  using fwd = dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  const fwd::desc desc =
      bias ? fwd::desc(prop, s.algorithm, s.src.layout, s.any_kernel, s.bias, s.dst.layout,
                       s.strides, s.padding_before, s.padding_after)
           : fwd::desc(prop, s.algorithm, s.src.layout, s.any_kernel, s.dst.layout, s.strides,
                       s.padding_before, s.padding_after);
  return fwd::primitive_desc(desc, attr, engine());
}

/// A copy of the kernel (or its gradient) from one layout to another; not needed when the
/// layouts agree.
struct KernelReorder {
  bool needed = false;
  dnnl::reorder primitive;
  dnnl::memory::desc from, to;
  size_t scratchpad_bytes = 0;
};

KernelReorder make_reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  KernelReorder r;
  r.from = from;
  r.to = to;
  if (from == to) return r;
  const dnnl::reorder::primitive_desc pd(engine(), from, engine(), to, attributes());
  r.needed = true;
  r.primitive = dnnl::reorder(pd);
  r.scratchpad_bytes = pd.scratchpad_desc().get_size();
  return r;
}

/// `data` reordered into `out` (a weights buffer when null), or `data` itself when no reorder is
/// needed.
const void* reordered(const KernelReorder& r, const void* data, void* out = nullptr) {
  if (!r.needed) return data;
  if (out == nullptr) out = weights_buffer(r.to.get_size());
  execute(r.primitive, {{DNNL_ARG_FROM, wrap(r.from, data)}, {DNNL_ARG_TO, wrap(r.to, out)}},
          r.scratchpad_bytes);
  return out;
}

// ---- the three primitives, as cached ------------------------------------------------------
//
// A Winograd key whose primitive oneDNN does not make caches null; the call then takes the
// direct key (cached_or_direct).

template <typename Entry, typename Create>
std::shared_ptr<const Entry> cached_or_direct(PrimitiveCache<ConvKey, Entry, ConvKeyHash>& cache,
                                              ConvKey key, Create create) {
  const auto creating = [&](const ConvKey& k) -> std::shared_ptr<const Entry> {
    try {
      return create(k);
    } catch (const dnnl::error&) {
      if (k.winograd) return nullptr;
      throw;
    }
  };
  if (auto entry = cache.get(key, creating)) return entry;
  key.winograd = false;
  return cache.get(key, creating);
}

struct Forward {
  ConvShapes shapes;
  dnnl::convolution_forward primitive;
  size_t scratchpad_bytes;
  KernelReorder kernel;  // HWIO -> the primitive's layout
};

std::shared_ptr<const Forward> create_forward(const ConvKey& key) {
  auto entry = std::make_shared<Forward>();
  entry->shapes = shapes(key);
  const auto pd = forward_desc(entry->shapes, key.bias, attributes(key.relu));
  entry->primitive = dnnl::convolution_forward(pd);
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->kernel = make_reorder(entry->shapes.kernel, pd.weights_desc());
  return entry;
}

struct BackwardWeights {
  ConvShapes shapes;
  dnnl::convolution_backward_weights primitive;
  size_t scratchpad_bytes;
  KernelReorder kernel_grad;  // the primitive's layout -> HWIO
};

std::shared_ptr<const BackwardWeights> create_backward_weights(const ConvKey& key) {
  using bwd = dnnl::convolution_backward_weights;
  auto entry = std::make_shared<BackwardWeights>();
  const ConvShapes& s = entry->shapes = shapes(key);
  const bwd::desc desc = key.bias
                             ? bwd::desc(s.algorithm, s.src.layout, s.any_kernel, s.bias,
                                         s.dst.layout, s.strides, s.padding_before, s.padding_after)
                             : bwd::desc(s.algorithm, s.src.layout, s.any_kernel, s.dst.layout,
                                         s.strides, s.padding_before, s.padding_after);
  const bwd::primitive_desc pd(desc, attributes(), engine(),
                               forward_desc(s, key.bias, attributes()));
  entry->primitive = bwd(pd);
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->kernel_grad = make_reorder(pd.diff_weights_desc(), s.kernel);
  return entry;
}

struct BackwardData {
  ConvShapes shapes;
  dnnl::convolution_backward_data primitive;
  size_t scratchpad_bytes;
  KernelReorder kernel;  // HWIO -> the primitive's layout
};

std::shared_ptr<const BackwardData> create_backward_data(const ConvKey& key) {
  using bwd = dnnl::convolution_backward_data;
  auto entry = std::make_shared<BackwardData>();
  const ConvShapes& s = entry->shapes = shapes(key);
  const bwd::desc desc(s.algorithm, s.src.layout, s.any_kernel, s.dst.layout, s.strides,
                       s.padding_before, s.padding_after);
  const bwd::primitive_desc pd(desc, attributes(), engine(),
                               forward_desc(s, /*bias=*/false, attributes()));
  entry->primitive = bwd(pd);
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->kernel = make_reorder(s.kernel, pd.weights_desc());
  return entry;
}

/// The shapes and window of a call, for error messages.
std::string describe(const ConvGeometry& g, int64_t filters) {
  return detail::str_cat("x [", g.batch, ", ", g.in_h, ", ", g.in_w, ", ", g.channels,
                         "] and kernel [", g.window_h, ", ", g.window_w, ", ", g.channels, ", ",
                         filters, "], strides [", g.stride_h, ", ", g.stride_w, "], output [",
                         g.out_h, ", ", g.out_w, "], padding before [", g.pad_top, ", ", g.pad_left,
                         "]");
}

[[noreturn]] void fail(const char* primitive, const dnnl::error& e, const ConvGeometry& g,
                       int64_t filters, const std::string& extra = "") {
  TANDEM_THROW("conv2d: oneDNN convolution ", primitive, " failed (", e.what(), ", status ",
               static_cast<int>(e.status), ") for ", describe(g, filters), extra);
}

// ---- 1x1 windows with strides ----------------------------------------------------------------
//
// A 1x1 convolution with strides > 1 reads every stride-th pixel and nothing else. oneDNN's 1x1
// kernels "reduce to unit stride" through a workspace of their own, and its backward-weights
// kernel writes past that workspace when the input channels are not a multiple of its channel
// block (oneDNN issue 6035, on AVX2 and AVX-512 alike): wrong kernel gradients that change from
// run to run with two threads or more, heap corruption and hangs. Tandem gathers those pixels
// itself and runs the unit-stride primitives on them, in every pass (the same sums, so the same
// results as a correct strided kernel).

/// Whether `g` is a 1x1 window with a stride > 1 (SAME or VALID: no padding for a 1x1 window).
bool strided_pointwise(const ConvGeometry& g) {
  return g.window_h == 1 && g.window_w == 1 && (g.stride_h > 1 || g.stride_w > 1) &&
         g.pad_top == 0 && g.pad_left == 0;
}

/// `g` over the gathered pixels: input [N, OH, OW, C], stride 1.
ConvGeometry unit_stride(const ConvGeometry& g) {
  ConvGeometry u = g;
  u.in_h = g.out_h;
  u.in_w = g.out_w;
  u.stride_h = u.stride_w = 1;
  return u;
}

/// x [N, H, W, C] -> gathered [N, OH, OW, C]: the pixels a strided 1x1 window reads.
void gather_strided(const ConvGeometry& g, size_t element, const void* x, void* gathered) {
  const size_t pixel = static_cast<size_t>(g.channels) * element;
  const auto* in = static_cast<const char*>(x);
  auto* out = static_cast<char*>(gathered);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow, out += pixel)
        std::memcpy(out, in + ((n * g.in_h + oh * g.stride_h) * g.in_w + ow * g.stride_w) * pixel,
                    pixel);
}

/// The adjoint: dx [N, H, W, C] holds `gathered` at the read pixels and zeros elsewhere.
void scatter_strided(const ConvGeometry& g, size_t element, const void* gathered, void* dx) {
  const size_t pixel = static_cast<size_t>(g.channels) * element;
  auto* out = static_cast<char*>(dx);
  std::memset(out, 0, static_cast<size_t>(g.batch * g.in_h * g.in_w) * pixel);
  const auto* in = static_cast<const char*>(gathered);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow, in += pixel)
        std::memcpy(out + ((n * g.in_h + oh * g.stride_h) * g.in_w + ow * g.stride_w) * pixel, in,
                    pixel);
}

size_t element_size(dt type) { return type == dt::f32 ? sizeof(float) : sizeof(uint16_t); }

/// Bytes of the gathered input of a strided 1x1 window.
size_t gathered_bytes(const ConvGeometry& g, dt type) {
  return static_cast<size_t>(g.batch * g.out_h * g.out_w * g.channels) * element_size(type);
}

void forward(dt type, const ConvGeometry& g, int64_t filters, const void* x, const void* w,
             const void* bias, bool relu, void* y) {
  static PrimitiveCache<ConvKey, Forward, ConvKeyHash> cache;
  if (strided_pointwise(g)) {
    CallBuffer gathered;
    void* pixels = gathered.get(gathered_bytes(g, type));
    gather_strided(g, element_size(type), x, pixels);
    return forward(type, unit_stride(g), filters, pixels, w, bias, relu, y);
  }
  try {
    const auto conv =
        cached_or_direct(cache, make_key(type, g, filters, bias != nullptr, relu), create_forward);
    const ConvShapes& s = conv->shapes;
    CallBuffer src_copy, dst_copy;
    const dnnl::memory out = output(s.dst, y, dst_copy);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, input(s.src, x, src_copy)},
        {DNNL_ARG_WEIGHTS, wrap(conv->kernel.to, reordered(conv->kernel, w))},
        {DNNL_ARG_DST, out}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, wrap(s.bias, bias));
    execute(conv->primitive, std::move(args), conv->scratchpad_bytes);
    finish_output(s.dst, out, y);
  } catch (const dnnl::error& e) {
    fail("forward", e, g, filters,
         detail::str_cat(bias != nullptr ? " + bias" : "", relu ? ", relu" : "",
                         type == dt::bf16 ? " in bfloat16" : ""));
  }
}

void backward_weights(dt type, const ConvGeometry& g, int64_t filters, const void* x,
                      const void* dy, void* dw, void* db) {
  static PrimitiveCache<ConvKey, BackwardWeights, ConvKeyHash> cache;
  if (strided_pointwise(g)) {
    CallBuffer gathered;
    void* pixels = gathered.get(gathered_bytes(g, type));
    gather_strided(g, element_size(type), x, pixels);
    return backward_weights(type, unit_stride(g), filters, pixels, dy, dw, db);
  }
  try {
    const auto conv = cached_or_direct(
        cache, make_key(type, g, filters, db != nullptr, /*relu=*/false), create_backward_weights);
    const ConvShapes& s = conv->shapes;
    const KernelReorder& to_hwio = conv->kernel_grad;
    void* grad = to_hwio.needed ? weights_buffer(to_hwio.from.get_size()) : dw;
    CallBuffer src_copy, dy_copy;
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, input(s.src, x, src_copy)},
                                               {DNNL_ARG_DIFF_DST, input(s.dst, dy, dy_copy)},
                                               {DNNL_ARG_DIFF_WEIGHTS, wrap(to_hwio.from, grad)}};
    if (db != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, wrap(s.bias, db));
    execute(conv->primitive, std::move(args), conv->scratchpad_bytes);
    reordered(to_hwio, grad, dw);
  } catch (const dnnl::error& e) {
    fail("backward-weights", e, g, filters,
         detail::str_cat(db != nullptr ? " with the bias gradient" : "",
                         type == dt::bf16 ? " in bfloat16" : ""));
  }
}

void backward_data(dt type, const ConvGeometry& g, int64_t filters, const void* dy, const void* w,
                   void* dx) {
  static PrimitiveCache<ConvKey, BackwardData, ConvKeyHash> cache;
  if (strided_pointwise(g)) {
    CallBuffer gathered;
    void* pixels = gathered.get(gathered_bytes(g, type));
    backward_data(type, unit_stride(g), filters, dy, w, pixels);
    return scatter_strided(g, element_size(type), pixels, dx);
  }
  try {
    const auto conv = cached_or_direct(
        cache, make_key(type, g, filters, /*bias=*/false, /*relu=*/false), create_backward_data);
    const ConvShapes& s = conv->shapes;
    CallBuffer dy_copy, dx_copy;
    const dnnl::memory out = output(s.src, dx, dx_copy);
    execute(conv->primitive,
            {{DNNL_ARG_DIFF_DST, input(s.dst, dy, dy_copy)},
             {DNNL_ARG_WEIGHTS, wrap(conv->kernel.to, reordered(conv->kernel, w))},
             {DNNL_ARG_DIFF_SRC, out}},
            conv->scratchpad_bytes);
    finish_output(s.src, out, dx);
  } catch (const dnnl::error& e) {
    fail("backward-data", e, g, filters, type == dt::bf16 ? " in bfloat16" : "");
  }
}

}  // namespace

void conv2d(const ConvGeometry& g, int64_t filters, const float* x, const float* w,
            const float* bias, bool relu, float* y) {
  forward(dt::f32, g, filters, x, w, bias, relu, y);
}

void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float* x,
                             const float* dy, float* dw, float* db) {
  backward_weights(dt::f32, g, filters, x, dy, dw, db);
}

void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float* dy, const float* w,
                          float* dx) {
  backward_data(dt::f32, g, filters, dy, w, dx);
}

bool has_bf16_convolutions() {
  // Asked once, with a tiny forward primitive: oneDNN makes bfloat16 convolutions on AVX-512
  // CPUs (natively with AVX512-BF16 or AMX), not below. Without the bfloat16 dot products its
  // emulation is slower than float32, so the operands are widened instead (conv.cpp).
  static const bool available = [] {
    if (cpu_isa() < CpuIsa::kAvx512CoreBf16) return false;
    try {
      ConvGeometry g{};
      g.batch = g.in_h = g.in_w = g.channels = g.window_h = g.window_w = 1;
      g.stride_h = g.stride_w = g.out_h = g.out_w = 1;
      (void)create_forward(make_key(dt::bf16, g, 1, false, false));
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

void conv2d(const ConvGeometry& g, int64_t filters, const bfloat16* x, const bfloat16* w,
            const bfloat16* bias, bool relu, bfloat16* y) {
  forward(dt::bf16, g, filters, x, w, bias, relu, y);
}

void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const bfloat16* x,
                             const bfloat16* dy, bfloat16* dw, bfloat16* db) {
  backward_weights(dt::bf16, g, filters, x, dy, dw, db);
}

void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx) {
  backward_data(dt::bf16, g, filters, dy, w, dx);
}

}  // namespace tandem::ops::cpu::onednn
