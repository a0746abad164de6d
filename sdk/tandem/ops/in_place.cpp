// Ops that are never recorded on tapes: in-place updates (for optimizers, accumulators and
// collectives) and the non-finite count.
#include <cmath>

#include "tandem/ops/cpu/elementwise.h"
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

namespace k = kernels;

using internal::common_device;
using internal::dispatch;
using internal::ptr;

// ---- in place -------------------------------------------------------------------------------

void add_(Tensor& dst, const Tensor& src, double alpha) {
  common_device("add_", {&dst, &src});
  TANDEM_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(), "add_: destination ",
               dst.shape(), " ", dst.dtype(), " and source ", src.shape(), " ", src.dtype(),
               " differ");
  TANDEM_CHECK(is_floating(dst.dtype()) || alpha == std::trunc(alpha), "add_: alpha ", alpha,
               " is not an integer, but the tensors hold ", dst.dtype());
  if (dst.numel() == 0) return;
  const k::BroadcastPlan plan = k::make_broadcast_plan(dst.shape(), src.shape(), dst.shape());
  dispatch_numeric(dst.dtype(), "add_", [&]<typename T>() {
    dispatch(
        "add_", dst.device(),
        [&] {
          cpu::binary(k::AddScaled{alpha}, plan, dst.data<T>(), src.data<T>(), dst.data<T>());
        },
        TANDEM_ON_CUDA(cuda::binary(k::AddScaled{alpha}, plan, ptr<T>(dst), ptr<T>(src),
                                    ptr<T>(dst), stream)));
  });
}

void scale_(Tensor& dst, double factor) {
  common_device("scale_", {&dst});
  dispatch_numeric(dst.dtype(), "scale_", [&]<typename T>() {
    dispatch(
        "scale_", dst.device(),
        [&] { cpu::unary(k::Scale{factor}, dst.numel(), dst.data<T>(), dst.data<T>()); },
        TANDEM_ON_CUDA(
            cuda::unary(k::Scale{factor}, dst.numel(), ptr<T>(dst), ptr<T>(dst), stream)));
  });
}

NonFinite count_non_finite(const Tensor& x) {
  NonFinite found;
  if (!x.defined() || x.numel() == 0 || !is_floating(x.dtype())) return found;
  NoRecordGuard no_record;
  if (std::isfinite(sum(mul(x, 0.0)).item<double>())) return found;
  const Tensor host = cast(x, DType::kFloat64).to(Device::cpu());
  for (double v : host.to_vector<double>()) {
    if (std::isnan(v)) ++found.nan;
    if (std::isinf(v)) ++found.inf;
  }
  return found;
}

}  // namespace tandem::ops
