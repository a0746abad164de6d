#!/usr/bin/env bash
# Starts a multi-worker job the way tf.distribute users do, without mpirun: N processes of the
# same program on this host (loopback), each with its own TF_CONFIG, started in a shuffled order
# with random delays. Passes when every worker exits 0.
#
#   tf_config_workers.sh N PROGRAM [program arguments...]
#
# TANDEM_TF_CONFIG_CHIEF=1 describes worker 0 as the "chief" task and the others as "worker"
# tasks 0..N-2 (TF's layout with a chief); otherwise all are "worker" tasks 0..N-1.
# TANDEM_TF_CONFIG_SKIP=K leaves worker K unstarted (the others must fail naming it; the script
# then passes when every started worker exits non-zero and names it).
set -euo pipefail

n="$1"
program="$2"
shift 2

say() { printf '[tf_config_workers] %s\n' "$*"; }

# Ports unique to this run (parallel runs must not meet): a block of N from the PID, below
# the ephemeral range (32768 and up) that the workers' own connections take ports from.
base=$((10000 + ($$ % 1200) * 16))
addresses=()
for ((i = 0; i < n; i++)); do addresses+=("\"127.0.0.1:$((base + i))\""); done
join() { local IFS=,; echo "$*"; }
if [[ "${TANDEM_TF_CONFIG_CHIEF:-0}" == 1 ]]; then
  cluster="{\"chief\": [${addresses[0]}], \"worker\": [$(join "${addresses[@]:1}")]}"
else
  cluster="{\"worker\": [$(join "${addresses[@]}")]}"
fi

scratch="$(mktemp -d /tmp/tandem-tf-config.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

skip="${TANDEM_TF_CONFIG_SKIP:--1}"
order=($(seq 0 $((n - 1)) | shuf))
say "cluster $cluster; starting workers in the order ${order[*]}"
declare -A pid_of
for i in "${order[@]}"; do
  if [[ "${TANDEM_TF_CONFIG_CHIEF:-0}" == 1 ]]; then
    if ((i == 0)); then task='{"type": "chief", "index": 0}'; else task="{\"type\": \"worker\", \"index\": $((i - 1))}"; fi
  else
    task="{\"type\": \"worker\", \"index\": $i}"
  fi
  if ((i == skip)); then
    say "worker $i is not started"
    continue
  fi
  sleep "0.$((RANDOM % 8))"
  TF_CONFIG="{\"cluster\": $cluster, \"task\": $task}" "$program" "$@" >"$scratch/worker$i.log" 2>&1 &
  pid_of[$i]=$!
  pids+=($!)
done

status=0
failed=()
for i in "${!pid_of[@]}"; do
  if ! wait "${pid_of[$i]}"; then
    failed+=("$i")
    status=1
  fi
done
for ((i = 0; i < n; i++)); do
  [[ -f "$scratch/worker$i.log" ]] || continue
  sed "s/^/[worker $i] /" "$scratch/worker$i.log"
done
if ((skip >= 0)); then
  started=${#pid_of[@]}
  if ((${#failed[@]} != started)); then
    say "FAILED: worker $skip never started, yet some workers exited 0"
    exit 1
  fi
  for i in "${!pid_of[@]}"; do
    if ! grep -q "worker $skip (127.0.0.1:$((base + skip)))" "$scratch/worker$i.log"; then
      say "FAILED: worker $i did not name the missing worker $skip"
      exit 1
    fi
  done
  say "passed: every started worker failed naming worker $skip"
  exit 0
fi
if ((status != 0)); then
  say "FAILED: workers ${failed[*]} exited non-zero"
  exit 1
fi
say "passed: all $n workers"
