#!/usr/bin/env bash
# scripts/check-layers: the SDK as it is passes; a tree that breaks each rule fails, naming the
# file, the line and the rule.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
check="$root/scripts/check-layers"
work="$(mktemp -d /tmp/tandem-check-layers.XXXXXX)"
trap 'rm -rf "$work"' EXIT

"$check" --quiet || { echo "FAIL: the SDK breaks its layer rules (above)"; exit 1; }

# expect_failure RULE_TEXT: check-layers on $work fails and prints RULE_TEXT.
expect_failure() {
  local status=0 out
  out="$("$check" --quiet --root "$work" 2>&1)" || status=$?
  echo "$out"
  [[ $status -eq 1 ]] || { echo "FAIL: exit $status, expected 1"; exit 1; }
  grep -qF -- "$1" <<<"$out" || { echo "FAIL: '$1' not reported"; exit 1; }
}
fresh_tree() {
  rm -rf "$work/sdk" "$work/samples"
  mkdir -p "$work/sdk/tandem/ops" "$work/sdk/tandem/autograd" "$work/sdk/tandem/data/internal" \
           "$work/sdk/tandem/distribute" "$work/samples/demo"
  printf '#pragma once\n' > "$work/sdk/tandem/autograd/tape.h"
  printf '#pragma once\n' > "$work/sdk/tandem/data/internal/node.h"
}

fresh_tree
"$check" --quiet --root "$work" || { echo "FAIL: a tree with no problem was refused"; exit 1; }

fresh_tree  # 1. a lower layer includes a higher one (the ops <-> autograd cycle)
printf '#include "tandem/core/error.h"\n#include "tandem/autograd/tape.h"\n' > "$work/sdk/tandem/ops/ops.cpp"
expect_failure "layers: sdk/tandem/ops/ops.cpp:2 includes tandem/autograd/tape.h: ops is not above autograd"

fresh_tree  # 2. a public header exposes an internal one; a sample includes one
printf '#pragma once\n#include "tandem/data/internal/node.h"\n' > "$work/sdk/tandem/data/dataset.h"
expect_failure "internal: sdk/tandem/data/dataset.h:2: public header includes the internal tandem/data/internal/node.h"
fresh_tree
printf '#include "tandem/data/internal/node.h"\n' > "$work/samples/demo/main.cpp"
expect_failure "internal: samples/demo/main.cpp:1: a sample includes the internal tandem/data/internal/node.h"

fresh_tree  # 3. a public header includes a back end's header
printf '#pragma once\n#include <mpi.h>\n' > "$work/sdk/tandem/data/dataset.h"
expect_failure "system: sdk/tandem/data/dataset.h:2: public header includes <mpi.h>"

fresh_tree  # 4. #if TANDEM_WITH_* in distribute/
printf 'int a;\n#if TANDEM_WITH_NCCL\nint b;\n#endif\n' > "$work/sdk/tandem/distribute/strategy.cpp"
expect_failure "dispatch: sdk/tandem/distribute/strategy.cpp:2"

fresh_tree  # 5. a source over 600 lines
seq 601 | sed 's/.*/\/\/ line/' > "$work/sdk/tandem/data/big.cpp"
expect_failure "size: sdk/tandem/data/big.cpp has 601 lines"

# The installed-tree check: an internal header or a back end's include is refused.
mkdir -p "$work/inst/tandem/core/internal"
printf '#pragma once\n#include "tandem/core/error.h"\n' > "$work/inst/tandem/tandem.h"
printf '#pragma once\n' > "$work/inst/tandem/core/error.h"
"$check" --installed "$work/inst" || { echo "FAIL: a clean installed tree was refused"; exit 1; }
printf '#pragma once\n#include <cuda_runtime_api.h>\n' > "$work/inst/tandem/core/internal/cuda_check.h"
status=0
out="$("$check" --installed "$work/inst")" || status=$?
echo "$out"
[[ $status -eq 1 ]] && grep -q "core/internal/cuda_check.h is internal" <<<"$out" &&
  grep -q "core/internal/cuda_check.h:2 includes <cuda_runtime_api.h>" <<<"$out" ||
  { echo "FAIL: the installed internal header was not refused"; exit 1; }
echo "ok"
