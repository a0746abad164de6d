# shellcheck shell=bash
# Helpers shared by scripts/train, scripts/test and .ci/run (sourced, not run).
# Provides: TANDEM_ROOT (the repository root), TANDEM_JOBS (default 2), heading, note, die,
# run_timed, configure_build, tandem_mpi_env.

TANDEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TANDEM_JOBS="${TANDEM_JOBS:-2}"

heading() { printf '\n==== %s ====\n' "$*"; }
note() { printf '[%s] %s\n' "${TANDEM_LOG_NAME:-$(basename "$0")}" "$*"; }
die() { printf '[%s] error: %s\n' "${TANDEM_LOG_NAME:-$(basename "$0")}" "$*" >&2; exit 1; }

# run_timed "label" command...: runs the command under a heading, prints how long it took and
# returns its exit status.
run_timed() {
  local label="$1"; shift
  heading "$label"
  local start=$SECONDS status=0
  "$@" || status=$?
  if [[ $status -eq 0 ]]; then
    note "$label: done in $((SECONDS - start)) s"
  else
    note "$label: FAILED (exit $status) after $((SECONDS - start)) s"
  fi
  return "$status"
}

# configure_build DIR [cmake options...]: configures the repository into DIR (default options
# unless given; CUDA is ON when nvcc is found), printing CMake's dependency summary.
configure_build() {
  local dir="$1"; shift
  cmake -S "$TANDEM_ROOT" -B "$TANDEM_ROOT/$dir" "$@"
}

# Open MPI refuses to run as root and to start more ranks than cores unless told; the
# multi-process tests and samples start several ranks on small machines (CI runs as root).
tandem_mpi_env() {
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
  fi
  export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"
}

# with_busy_cores N COMMAND...: runs COMMAND while N other processes each keep a core busy (a
# shell loop at the same priority), as on a machine shared with other work: races that only
# show when a thread loses its core mid-step, and waits that burn a core another thread needs,
# show up here instead of on users' machines. N=0 runs COMMAND alone. Returns its status.
# Each busy process is pinned to a core of its own (taskset, round-robin over the cores this
# shell may use): left free, the kernel sometimes puts two on one core and leaves another free,
# and figures measured beside them jump between two machines. BUSY_PINNED=0 leaves them free.
with_busy_cores() {
  local count="$1"; shift
  local pids=() i status=0
  local cores=()
  if [[ ${BUSY_PINNED:-1} != 0 ]] && command -v taskset >/dev/null; then
    read -r -a cores <<<"$(taskset -pc "$BASHPID" 2>/dev/null | sed 's/.*: //' |
      awk -F, '{ for (i = 1; i <= NF; ++i) { n = split($i, r, "-")
                 for (c = r[1]; c <= r[n]; ++c) printf "%d ", c } }')"
  fi
  for ((i = 0; i < count; ++i)); do
    if [[ ${#cores[@]} -gt 0 ]]; then
      taskset -c "${cores[i % ${#cores[@]}]}" sh -c 'while :; do :; done' &
    else
      sh -c 'while :; do :; done' &
    fi
    pids+=($!)
  done
  "$@" || status=$?
  if [[ ${#pids[@]} -gt 0 ]]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  return "$status"
}
