#!/usr/bin/env bash
# Tandem on a machine shared with other work: the Fashion-MNIST MLP sample (1 and 2 CPU
# replicas, epoch 2's samples/s), PyTorch on the same job (bench/peers/torch_epoch.py, the better
# of 1 thread with a 1-thread OpenBLAS and 2 threads) and the in-process all-reduce
# (bench_allreduce_cpu, 2 replicas), each timed on the quiet machine and beside one busy process
# per core (a shell loop at the same priority), pinned to its core and left free to move,
# quiet and loaded interleaved round by round. Prints the median of each and the ratios.
#
# What bounds the loaded figures: beside a pinned busy process, a thread that is always
# runnable gets half its core; one that sleeps at hand-offs gets less, and two threads that must
# meet (an OpenMP barrier, a rendezvous) run together only while both are scheduled. With free
# busy processes, the kernel may share 2 cores among 3 runnable threads (2/3 each).
#
#   bench/shared_cores.sh [--rounds N] [--build DIR] [--busy N] [--skip-torch]
#
#   --rounds N     rounds (default 3); each runs every measurement quiet, then loaded (pinned
#                  busy processes, then free ones)
#   --build DIR    build folder (default build/): the sample and the bench are built there
#   --busy N       busy processes beside the loaded runs (default: one per core)
#   --skip-torch   leave PyTorch out
# PyTorch is Debian's python3-torch, installed (apt-get) when missing.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
TANDEM_LOG_NAME=shared-cores  # how note() and die() label this script's lines (not exported)
cd "$TANDEM_ROOT"

rounds=3 build=build busy="$(nproc)" torch=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --busy) busy="$2"; shift 2 ;;
    --skip-torch) torch=0; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (bench/shared_cores.sh --help)" ;;
  esac
done
if [[ $torch -eq 1 ]] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  note "installing python3-torch (apt-get)"
  as_root=()
  [[ $(id -u) -eq 0 ]] || as_root=(sudo)
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq python3-torch >/dev/null
fi
[[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target fashion_mnist_mlp bench_allreduce_cpu -j "$TANDEM_JOBS" >/dev/null
sample="$build/samples/fashion_mnist_mlp/fashion_mnist_mlp"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export TANDEM_LOG_LEVEL=warning

# Each prints one figure, or "-" when the run failed or outlasted its limit.
sample_rate() {  # REPLICAS: epoch 2's samples/s
  { timeout 300 "$sample" --fresh --epochs 2 --replicas "$1" --checkpoint-dir "$scratch/ck" 2>&1 ||
      true; } |
    awk '/^epoch 2\/2:/ { for (i = 1; i < NF; ++i) if ($(i + 1) == "samples/s") v = $i }
         END { print v == "" ? "-" : v }'
}
torch_rate() {  # the better of 1 thread (OpenBLAS too: it spins otherwise) and 2 threads
  { OPENBLAS_NUM_THREADS=1 timeout 90 /usr/bin/python3 bench/peers/torch_epoch.py --epochs 2 \
      --threads 1 2>&1 || true
    timeout 90 /usr/bin/python3 bench/peers/torch_epoch.py --epochs 2 --threads 2 2>&1 || true
  } | awk '/^best last epoch:/ && $4 > v { v = $4 } END { print v == "" ? "-" : v }'
}
allreduce_rates() {  # 2 replicas' algbw (GB/s) at 64 KiB, 256 KiB and 4 MiB
  { timeout 300 "$build/bench/bench_allreduce_cpu" --min-kib 64 --max-mib 4 --samples 3 2>&1 ||
      true; } |
    awk -F'|' '{ gsub(/^ +| +$/, "", $1); split($3, f, " "); v[$1] = f[1] }
               END { for (i = 1; i <= 3; ++i) { s = i == 1 ? "64 KiB" : i == 2 ? "256 KiB" : "4 MiB"
                                               printf "%s ", (s in v) ? v[s] : "-" } print "" }'
}

names=("sample, 1 replica" "sample, 2 replicas" "all-reduce 64 KiB" "all-reduce 256 KiB"
       "all-reduce 4 MiB")
units=("samples/s" "samples/s" "GB/s" "GB/s" "GB/s")
[[ $torch -eq 1 ]] && names+=("PyTorch, same job") && units+=("samples/s")
declare -A quiet pinned free
record() {  # ARRAY LOAD PINNED: one measurement of each, into quiet, pinned or free
  local -n into="$1"
  local load="$2" a b c
  export BUSY_PINNED="$3"
  into[0]+="$(with_busy_cores "$load" sample_rate 1) "
  into[1]+="$(with_busy_cores "$load" sample_rate 2) "
  read -r a b c <<<"$(with_busy_cores "$load" allreduce_rates)"
  into[2]+="$a " into[3]+="$b " into[4]+="$c "
  [[ $torch -eq 0 ]] || into[5]+="$(with_busy_cores "$load" torch_rate) "
}
for ((round = 1; round <= rounds; ++round)); do
  note "round $round of $rounds"
  record quiet 0 1
  record pinned "$busy" 1
  record free "$busy" 0
done

median() { tr ' ' '\n' | grep -v -e '^$' -e '^-$' | sort -g |
           awk '{ v[NR] = $1 } END { print NR == 0 ? "-" : (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "-" || b == "-" || b == 0) ? "-" : sprintf("%.2fx", a / b) }'; }
echo
echo "Shared cores: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $busy busy process(es) beside the loaded runs (pinned: one per core; free: the kernel places them), median of $rounds round(s)"
printf '%-22s %-10s %10s %10s %10s %8s %8s\n' measurement unit quiet pinned free pin/q free/q
declare -A mq mp mf
for i in "${!names[@]}"; do
  mq[$i]="$(median <<<"${quiet[$i]}")"
  mp[$i]="$(median <<<"${pinned[$i]}")"
  mf[$i]="$(median <<<"${free[$i]}")"
  printf '%-22s %-10s %10s %10s %10s %8s %8s\n' "${names[$i]}" "${units[$i]}" "${mq[$i]}" \
    "${mp[$i]}" "${mf[$i]}" "$(ratio "${mp[$i]}" "${mq[$i]}")" "$(ratio "${mf[$i]}" "${mq[$i]}")"
done
for i in "${!names[@]}"; do
  echo "  ${names[$i]}: quiet ${quiet[$i]}| pinned ${pinned[$i]}| free ${free[$i]}"
done
if [[ $torch -eq 1 ]]; then
  for r in 0 1; do
    echo "sample ($((r + 1)) replica$([[ $r -eq 1 ]] && echo s)) / PyTorch: quiet $(ratio "${mq[$r]}" "${mq[5]}"), pinned $(ratio "${mp[$r]}" "${mp[5]}"), free $(ratio "${mf[$r]}" "${mf[5]}")"
  done
fi
echo "reproduce: bench/shared_cores.sh --rounds $rounds --build $build --busy $busy"
