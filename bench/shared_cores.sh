#!/usr/bin/env bash
# Tandem on a machine shared with other work: the Fashion-MNIST MLP sample (1 and 2 CPU
# replicas, epoch 2's samples/s), PyTorch on the same job (bench/peers/torch_epoch.py, the better
# of 1 and 2 threads) and the in-process all-reduce (bench_allreduce_cpu, 2 replicas), each timed
# on the quiet machine and beside one busy process per core (a shell loop at the same priority),
# quiet and loaded interleaved round by round. Prints the median of each and the ratios.
#
#   bench/shared_cores.sh [--rounds N] [--build DIR] [--busy N] [--skip-torch]
#
#   --rounds N     rounds (default 3); each runs every measurement quiet, then loaded
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
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
  timeout 300 "$sample" --fresh --epochs 2 --replicas "$1" --checkpoint-dir "$scratch/ck" 2>&1 |
    awk '/^epoch 2\/2:/ { for (i = 1; i < NF; ++i) if ($(i + 1) == "samples/s") v = $i }
         END { print v == "" ? "-" : v }'
}
torch_rate() {
  timeout 600 /usr/bin/python3 bench/peers/torch_epoch.py --epochs 2 2>&1 |
    awk '/^best last epoch:/ { v = $4 } END { print v == "" ? "-" : v }'
}
allreduce_rates() {  # 2 replicas' algbw (GB/s) at 64 KiB, 256 KiB and 4 MiB
  timeout 300 "$build/bench/bench_allreduce_cpu" --min-kib 64 --max-mib 4 --samples 3 2>&1 |
    awk -F'|' '{ gsub(/^ +| +$/, "", $1); split($3, f, " "); v[$1] = f[1] }
               END { for (i = 1; i <= 3; ++i) { s = i == 1 ? "64 KiB" : i == 2 ? "256 KiB" : "4 MiB"
                                               printf "%s ", (s in v) ? v[s] : "-" } print "" }'
}

names=("sample, 1 replica" "sample, 2 replicas" "all-reduce 64 KiB" "all-reduce 256 KiB"
       "all-reduce 4 MiB")
units=("samples/s" "samples/s" "GB/s" "GB/s" "GB/s")
[[ $torch -eq 1 ]] && names+=("PyTorch, same job") && units+=("samples/s")
declare -A quiet loaded
record() {  # ARRAY LOAD: one measurement of each, into quiet or loaded
  local -n into="$1"
  local load="$2" a b c
  into[0]+="$(with_busy_cores "$load" sample_rate 1) "
  into[1]+="$(with_busy_cores "$load" sample_rate 2) "
  read -r a b c <<<"$(with_busy_cores "$load" allreduce_rates)"
  into[2]+="$a " into[3]+="$b " into[4]+="$c "
  [[ $torch -eq 0 ]] || into[5]+="$(with_busy_cores "$load" torch_rate) "
}
for ((round = 1; round <= rounds; ++round)); do
  note "round $round of $rounds"
  record quiet 0
  record loaded "$busy"
done

median() { tr ' ' '\n' | grep -v -e '^$' -e '^-$' | sort -g |
           awk '{ v[NR] = $1 } END { print NR == 0 ? "-" : (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "-" || b == "-" || b == 0) ? "-" : sprintf("%.2fx", a / b) }'; }
echo
echo "Shared cores: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $busy busy process(es) beside the loaded runs, median of $rounds round(s)"
printf '%-22s %-10s %12s %12s %14s\n' measurement unit quiet loaded loaded/quiet
declare -A med_quiet med_loaded
for i in "${!names[@]}"; do
  med_quiet[$i]="$(median <<<"${quiet[$i]}")"
  med_loaded[$i]="$(median <<<"${loaded[$i]}")"
  printf '%-22s %-10s %12s %12s %14s\n' "${names[$i]}" "${units[$i]}" "${med_quiet[$i]}" \
    "${med_loaded[$i]}" "$(ratio "${med_loaded[$i]}" "${med_quiet[$i]}")"
done
for i in "${!names[@]}"; do echo "  ${names[$i]}: quiet ${quiet[$i]}| loaded ${loaded[$i]}"; done
if [[ $torch -eq 1 ]]; then
  echo "sample (1 replica) / PyTorch: quiet $(ratio "${med_quiet[0]}" "${med_quiet[5]}"), loaded $(ratio "${med_loaded[0]}" "${med_loaded[5]}")"
fi
echo "reproduce: bench/shared_cores.sh --rounds $rounds --build $build --busy $busy"
