#!/usr/bin/env bash
# bench_overlap_cpu across two "hosts": two network namespaces joined by a veth pair whose each
# direction is rate-limited (tc tbf), one worker (one CPU replica, one CPU) in each, talking
# over TCP through Open MPI (started by mpirun) or Gloo (each worker started from its
# TF_CONFIG). Needs root (CAP_NET_ADMIN) and a build with MPI or Gloo.
#
#   bench/overlap_veth.sh [BUILD_DIR] [RATE] [mpi|gloo] [bench_overlap_cpu arguments...]
#   e.g. bench/overlap_veth.sh build 5gbit gloo --rounds 5
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
rate="${2:-5gbit}"  # "none": the veth pair at full speed
[[ "$rate" == none ]] && rate=""
shift $(($# >= 2 ? 2 : $#))
launch=mpirun
case "${1:-}" in
  mpi) shift ;;
  gloo) launch=tf_config; shift ;;
esac
program="$build/bench/bench_overlap_cpu"
[[ -x "$program" ]] || { echo "overlap_veth: $program not built (TANDEM_BUILD_BENCH=ON)" >&2; exit 2; }
export TANDEM_VETH_RATE="$rate" TANDEM_VETH_PIN=1 TANDEM_CPU_REPLICAS=1 TANDEM_LOG_LEVEL=warning
exec bash "$here/../tests/mpi/two_hosts_veth.sh" "$launch" "$program" "$@"
