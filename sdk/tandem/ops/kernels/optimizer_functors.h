// The per-element math of the fused optimizer updates (ops/optimizer_updates.h), written once
// for the CPU loop and the CUDA kernel. Each functor updates one element of a variable and its
// kSlots slots in place, with the operations and roundings of the separate ops it replaces
// (Keras' order). The files that run them are compiled without multiply-add contraction, so
// every product and sum is rounded on its own as it was when each op wrote a tensor.
//
// A new update rule is its functor here and one name in TANDEM_FUSED_UPDATE_RULES (the end of
// this file): the CPU loop (built per instruction set), the CUDA multi-tensor kernel and
// ops::fused_update_ are instantiated from that list.
#pragma once

#ifndef __CUDA_ARCH__
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#endif

#include "tandem/core/host_device.h"
#include "tandem/ops/kernels/functors.h"

namespace tandem::ops::kernels {

/// Plain SGD: w -= g * lr.
template <typename T>
struct SgdUpdate {
  static constexpr int kSlots = 0;
  T learning_rate;
  TANDEM_HD_INLINE void operator()(T& w, T g) const {
    const T scaled = g * learning_rate;
    w = w - scaled;  // add_(w, scaled, -1): w + (-1) * scaled is exactly w - scaled
  }
};

/// SGD with momentum (m is the velocity slot, which includes -lr):
///   m = m * momentum - g * lr;  w += m, or with nesterov w += m * momentum - g * lr.
template <typename T>
struct SgdMomentumUpdate {
  static constexpr int kSlots = 1;
  T learning_rate;
  T momentum;
  bool nesterov;
  TANDEM_HD_INLINE void operator()(T& w, T g, T& m) const {
    const T scaled = g * learning_rate;
    const T m_new = m * momentum - scaled;
    m = m_new;
    if (nesterov) {
      const T step = m_new * momentum - scaled;
      w = w + step;
    } else {
      w = w + m_new;
    }
  }
};

/// Adam (AdamW when decay): first w -= (w * weight_decay) * lr, then
///   m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2);
///   w -= (m * alpha) / (sqrt(v) + epsilon).
template <typename T>
struct AdamUpdate {
  static constexpr int kSlots = 2;
  T alpha;
  T one_minus_beta_1;
  T one_minus_beta_2;
  T epsilon;
  bool decay;  // AdamW's decoupled weight decay is on
  T weight_decay;
  T learning_rate;
  TANDEM_HD_INLINE void operator()(T& w, T g, T& m, T& v) const {
    T w_new = w;
    if (decay) {
      const T decayed = (w_new * weight_decay) * learning_rate;
      w_new = w_new - decayed;
    }
    const T m_step = (g - m) * one_minus_beta_1;
    const T m_new = m + m_step;
    const T v_step = (g * g - v) * one_minus_beta_2;
    const T v_new = v + v_step;
    const T step = (m_new * alpha) / (math::sqrt(v_new) + epsilon);
    m = m_new;
    v = v_new;
    w = w_new - step;
  }
};

/// sign(x): -1, +1, x itself for a zero (its sign kept) or a NaN (tf.sign). On the host in integer
/// operations on the bits, which GCC vectorizes (a select of floats, or a float comparison turned
/// into a number, keeps its AVX2 loop scalar).
template <typename T>
TANDEM_HD_INLINE T sign_of(T x) {
#ifdef __CUDA_ARCH__
  return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);
#else
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits kSign = Bits{1} << (sizeof(T) * 8 - 1);
  const Bits bits = std::bit_cast<Bits>(x), magnitude = bits & ~kSign;
  const Bits infinity = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
  // x itself where it is a zero or NaN, else +-1 with its sign.
  const Bits keep = Bits{0} - static_cast<Bits>((magnitude == 0) | (magnitude > infinity));
  const Bits unit = (bits & kSign) | std::bit_cast<Bits>(T(1));
  return std::bit_cast<T>((unit & ~keep) | (bits & keep));
#endif
}

/// Lion (keras/src/optimizers/lion.py; the decay of base_optimizer's _apply_weight_decay):
/// first w -= (w * weight_decay) * lr when decay, then
///   w -= lr * sign(m * beta_1 + g * (1 - beta_1));  m = m * beta_2 + g * (1 - beta_2),
/// (1 - beta) computed in T, as Keras computes it on the cast beta. sign(NaN) is NaN.
template <typename T>
struct LionUpdate {
  static constexpr int kSlots = 1;
  T learning_rate;
  T beta_1;
  T one_minus_beta_1;
  T beta_2;
  T one_minus_beta_2;
  bool decay;  // decoupled weight decay is on
  T weight_decay;
  TANDEM_HD_INLINE void operator()(T& w, T g, T& m) const {
    T w_new = w;
    if (decay) {
      const T decayed = (w_new * weight_decay) * learning_rate;
      w_new = w_new - decayed;
    }
    const T direction = m * beta_1 + g * one_minus_beta_1;
    const T sign = sign_of(direction);
    const T step = learning_rate * sign;
    w = w_new - step;
    m = m * beta_2 + g * one_minus_beta_2;
  }
};

}  // namespace tandem::ops::kernels

/// Every fused update rule, as X(functor template of tandem::ops::kernels): what the CPU loop,
/// the CUDA kernel and ops::fused_update_ are instantiated for.
#define TANDEM_FUSED_UPDATE_RULES(X) X(SgdUpdate) X(SgdMomentumUpdate) X(AdamUpdate) X(LionUpdate)
