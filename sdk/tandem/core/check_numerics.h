// TANDEM_CHECK_NUMERICS: whether losses and gradients are checked for NaN and Inf as training
// runs (off by default; the checks cost one pass over each gradient and a read-back).
#pragma once

namespace tandem {

/// True when numerics checks are on: TANDEM_CHECK_NUMERICS=1 (read once), unless
/// set_check_numerics overrides it. With it on, compute_average_loss raises on a non-finite
/// loss and apply_gradients on a non-finite gradient, naming the replica, the step and the
/// variable.
bool check_numerics_enabled();

/// Turns the checks on or off for the whole process (overrides the environment); returns the
/// previous setting.
bool set_check_numerics(bool enabled);

}  // namespace tandem
