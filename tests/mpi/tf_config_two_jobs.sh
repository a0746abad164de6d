#!/usr/bin/env bash
# Two jobs of the Fashion-MNIST sample pointed at the same chief address (the same TF_CONFIG),
# job B with another learning rate:
#   1. job A alone, for reference;
#   2. job A again, and once it has formed, job B: B's chief cannot serve the address, B's
#      worker finds worker 1's place taken; both exit non-zero saying so, and A ends exactly as
#      it did alone;
#   3. interleaved: B's worker 1 joins A's chief first; nobody trains that mixed job: both raise
#      before the first update naming the learning rate, and A's own worker 1 and B's chief are
#      refused.
#
#   tf_config_two_jobs.sh SAMPLE
set -euo pipefail

sample="$1"
say() { printf '[tf_config_two_jobs] %s\n' "$*"; }
fail() {
  say "FAILED: $*"
  exit 1
}

base=$((10000 + ($$ % 1200) * 16))
cluster="{\"worker\": [\"127.0.0.1:$base\", \"127.0.0.1:$((base + 1))\"]}"
scratch="$(mktemp -d /tmp/tandem-two-jobs.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT
export TANDEM_LOG_LEVEL=info TANDEM_COLLECTIVE_TIMEOUT=20 OMP_NUM_THREADS=1

# start NAME INDEX LEARNING_RATE: one worker of a job, in the background; its log is NAME.log.
declare -A pid_of
start() {
  local name="$1" index="$2" rate="$3"
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $index}}" \
    "$sample" --fresh --epochs 1 --max-steps 100 --learning-rate "$rate" \
    --checkpoint-dir "$scratch/ckpt-$name" >"$scratch/$name.log" 2>&1 &
  pid_of[$name]=$!
  pids+=($!)
}
# finish NAME: waits for it; its exit code is in $code.
code=0
finish() {
  code=0
  wait "${pid_of[$1]}" || code=$?
}
# formed NAME: waits until the worker logged its share of the cores (the job has formed).
formed() {
  for _ in $(seq 1 300); do
    grep -q "computes on core" "$scratch/$1.log" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$scratch/$1.log"
  fail "$1 never joined a job"
}
expect_in() {  # expect_in NAME TEXT
  grep -qF -- "$2" "$scratch/$1.log" || { cat "$scratch/$1.log"; fail "$1 did not say: $2"; }
}
result() { grep -E "^epoch 1/1: |^final test accuracy" "$scratch/$1.log" | sed 's/  [0-9]* samples\/s.*//'; }

say "1. job A alone"
start a0 0 0.001
start a1 1 0.001
both_zero() {  # both_zero A B: waits for both; true when both exited 0
  finish "$1"
  local first=$code
  finish "$2"
  [[ $first == 0 && $code == 0 ]]
}
both_zero a0 a1 || { cat "$scratch/a0.log" "$scratch/a1.log"; fail "job A alone"; }
reference="$(result a0)"
say "job A alone: $reference"

say "2. job A, then job B at the same address once A has formed"
start a0 0 0.001
start a1 1 0.001
formed a0
start b0 0 0.01
start b1 1 0.01
finish b0
[[ $code != 0 ]] || fail "job B's chief exited 0"
finish b1
[[ $code != 0 ]] || fail "job B's worker exited 0"
expect_in b0 "the chief cannot listen on 127.0.0.1:$base"
expect_in b1 "another process already joined this job as worker 1 (127.0.0.1:$((base + 1)))"
both_zero a0 a1 || { cat "$scratch/a0.log" "$scratch/a1.log"; fail "job A beside B"; }
[[ "$(result a0)" == "$reference" ]] || fail "job A beside B ended with $(result a0), alone with $reference"
for name in b0 b1; do say "$name: $(grep -m1 -iE 'error|refused|cannot' "$scratch/$name.log")"; done
say "job B refused; job A unharmed: $(result a0)"

say "3. interleaved: B's worker 1 joins A's chief first"
start a0 0 0.001
start b1 1 0.01
formed a0
start a1 1 0.001
start b0 0 0.01
for name in a0 b1 a1 b0; do
  finish "$name"
  [[ $code != 0 ]] || { cat "$scratch/$name.log"; fail "$name exited 0"; }
done
expect_in a0 "adam learning_rate is 0.001 on the chief (worker 0) and 0.01 on worker 1"
expect_in b1 "adam learning_rate is 0.001 on the chief (worker 0) and 0.01 on worker 1"
grep -qE "another process already joined this job as worker 1|already joined this job and left it" \
  "$scratch/a1.log" || { cat "$scratch/a1.log"; fail "A's worker 1 was not refused"; }
grep -qE "the chief cannot listen on 127.0.0.1:$base|did not arrive within" "$scratch/b0.log" \
  || { cat "$scratch/b0.log"; fail "B's chief did not fail"; }
for name in a0 b1 a1 b0; do
  say "$name: $(grep -m1 -iE 'not train the same|refused|cannot|did not arrive' "$scratch/$name.log")"
done
say "passed: the mixed job raised before its first update, naming the learning rate"
