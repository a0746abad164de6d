#!/usr/bin/env bash
# Two replicas of the Fashion-MNIST sample on this machine, started four ways: two CPU replicas
# in one process, `mpirun -np 2`, two workers started one by one from TF_CONFIG (shared memory
# between them), and the same over TCP (Gloo, TANDEM_WORKER_TRANSPORT=tcp). Every round runs
# each way once, in a shuffled order; the table gives the median training throughput over the
# rounds (the sample's "samples/s" of its epoch: --max-steps steps of batch 64 per replica) and
# its ratio to mpirun -np 2. The companion of bench_scaling_cpu (replicas in one process).
#
#   bench/scaling_workers.sh BUILD_DIR [--rounds 7] [--steps 200]
set -euo pipefail

build="${1:?usage: bench/scaling_workers.sh BUILD_DIR [--rounds N] [--steps N]}"
shift
rounds=7
steps=200
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "scaling_workers.sh: unknown argument $1 (--rounds N, --steps N)" >&2; exit 2 ;;
  esac
done
sample="$build/samples/fashion_mnist_mlp/fashion_mnist_mlp"
[[ -x "$sample" ]] || { echo "scaling_workers.sh: no $sample (build the samples)" >&2; exit 2; }
scratch="$(mktemp -d /tmp/tandem-scaling-workers.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
export TANDEM_LOG_LEVEL=warning OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=(--fresh --epochs 1 --max-steps "$steps" --checkpoint-dir "$scratch/ckpt")

modes=("in-process 2 replicas" "mpirun -np 2" "TF_CONFIG 2 workers" "TF_CONFIG 2 workers, tcp")
have_mpirun=1
command -v mpirun >/dev/null || have_mpirun=0

throughput() {  # the samples/s of the epoch line in a log
  sed -n 's/^epoch 1\/1: .* \([0-9][0-9]*\) samples\/s .*/\1/p' "$1" | tail -1
}

tf_config_pair() {  # tf_config_pair TRANSPORT LOG: two workers, the chief's output in LOG
  local port=$((20000 + RANDOM % 20000))
  local cluster="{\"worker\": [\"127.0.0.1:$port\", \"127.0.0.1:$((port + 1))\"]}"
  TANDEM_WORKER_TRANSPORT="$1" TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
    "$sample" "${flags[@]}" --checkpoint-dir "$scratch/ckpt1" >/dev/null 2>&1 &
  local other=$!
  TANDEM_WORKER_TRANSPORT="$1" TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
    "$sample" "${flags[@]}" >"$2" 2>&1 || true
  wait "$other" || true
}

run_mode() {  # run_mode MODE LOG
  case "$1" in
    "in-process 2 replicas") "$sample" "${flags[@]}" --replicas 2 >"$2" 2>&1 || true ;;
    "mpirun -np 2")
      if [[ $have_mpirun == 1 ]]; then mpirun -np 2 "$sample" "${flags[@]}" >"$2" 2>&1 || true; fi ;;
    "TF_CONFIG 2 workers") tf_config_pair auto "$2" ;;
    "TF_CONFIG 2 workers, tcp") tf_config_pair tcp "$2" ;;
  esac
}

declare -A samples
for ((round = 0; round < rounds; round++)); do
  mapfile -t order < <(printf '%s\n' "${!modes[@]}" | shuf)
  for i in "${order[@]}"; do
    mode="${modes[$i]}"
    run_mode "$mode" "$scratch/log"
    value="$(throughput "$scratch/log")"
    samples[$mode]+="${value:-0} "
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR]=$1} END {print (NR ? v[int((NR+1)/2)] : 0)}'; }
minimum() { tr ' ' '\n' | grep -v '^$' | sort -n | head -1; }
maximum() { tr ' ' '\n' | grep -v '^$' | sort -n | tail -1; }

printf 'scaling_workers: fashion_mnist_mlp, 2 replicas x batch 64, %s steps, %s rounds (%s cores, %s)\n' \
  "$steps" "$rounds" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
printf '%-28s %12s %10s %10s %14s\n' "mode" "samples/s" "min" "max" "vs mpirun -np 2"
reference="$(median <<<"${samples[mpirun -np 2]}")"
for mode in "${modes[@]}"; do
  m="$(median <<<"${samples[$mode]}")"
  ratio="-"
  [[ "$reference" != 0 && "$m" != 0 ]] && ratio="$(awk -v a="$m" -v b="$reference" 'BEGIN {printf "%.2f", a / b}')"
  printf '%-28s %12s %10s %10s %14s\n' "$mode" "$m" "$(minimum <<<"${samples[$mode]}")" \
    "$(maximum <<<"${samples[$mode]}")" "$ratio"
done
echo "reproduce: bench/scaling_workers.sh $build --rounds $rounds --steps $steps"
