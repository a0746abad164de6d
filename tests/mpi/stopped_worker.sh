#!/usr/bin/env bash
# A worker stopped with SIGSTOP mid-training under mpirun is named by the others (its rank, host
# and pid) and the job ends non-zero within TANDEM_COLLECTIVE_TIMEOUT + 5 s, whether the stop
# lands while the others wait for its arrival or while they are inside a blocking MPI call with
# it. Each trial starts the [.stopfault] program, waits until it trains, stops one worker after
# a random delay, and times the job's end from the stop; the stopped worker is then continued
# and killed, so nothing is left behind.
#
#   stopped_worker.sh MPIRUN TEST_PROGRAM [TRIALS] [WORKERS]
#
# Prints one line per trial ("trial 3: worker 1 (pid 4711) named after 3.52 s") and the median
# and maximum; exits non-zero at the first trial that fails.
set -u
mpirun=$1
program=$2
trials=${3:-2}
workers=${4:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
export TANDEM_LOG_LEVEL=${TANDEM_LOG_LEVEL:-warning}
export TANDEM_COLLECTIVE_TIMEOUT=${TANDEM_COLLECTIVE_TIMEOUT:-3}
bound=$(awk -v t="$TANDEM_COLLECTIVE_TIMEOUT" 'BEGIN { print t + 5 }')
log=$(mktemp /tmp/tandem_stopped_worker_XXXXXX)
job=
victim=
# Ends what is left of the job: continues the stopped worker, asks mpirun to end the job, then
# kills mpirun and every worker that said its pid.
end_job() {
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
  if [ -n "$job" ]; then
    kill -TERM "$job" 2>/dev/null
    for ((i = 0; i < 50 && $(kill -0 "$job" 2>/dev/null && echo 1 || echo 0); ++i)); do
      sleep 0.1
    done
    kill -KILL "$job" 2>/dev/null
    wait "$job" 2>/dev/null
  fi
  local worker
  for worker in $(sed -n 's/^.*worker [0-9]* pid \([0-9]*\)$/\1/p' "$log" 2>/dev/null); do
    kill -KILL "$worker" 2>/dev/null
  done
  job=
  victim=
}
cleanup() {
  end_job
  rm -f "$log"
}
trap cleanup EXIT
now() { date +%s.%N; }
times=()
for ((trial = 1; trial <= trials; ++trial)); do
  : >"$log"
  "$mpirun" -np "$workers" "$program" --use-colour no "[.stopfault]" >"$log" 2>&1 &
  job=$!
  # The worker to stop: 1, or the last one in a job of 2.
  target=$((workers > 2 ? 1 : workers - 1))
  victim=
  for ((i = 0; i < 600; ++i)); do
    grep -q '^training' "$log" && victim=$(sed -n "s/^.*worker $target pid \([0-9]*\)$/\1/p" "$log")
    [ -n "$victim" ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$victim" ]; then
    echo "trial $trial: the job did not start training; its output:"
    cat "$log"
    exit 1
  fi
  # Somewhere in a step: while the others wait for its arrival, or inside a blocking MPI call.
  sleep "0.$((RANDOM % 1000))"
  kill -STOP "$victim"
  stopped=$(now)
  ended=
  while kill -0 "$job" 2>/dev/null; do
    if awk -v s="$stopped" -v n="$(now)" -v b="$bound" 'BEGIN { exit !(n - s > b + 20) }'; then
      break
    fi
    sleep 0.05
  done
  if ! kill -0 "$job" 2>/dev/null; then
    ended=$(now)
    wait "$job"
    status=$?
    job=
  else
    status=hung
  fi
  stopped_pid=$victim
  end_job  # the stopped worker continued and killed, and whatever else is left
  if [ "$status" = hung ]; then
    echo "trial $trial: the job still ran $bound + 20 s after worker $target (pid $stopped_pid) was" \
      "stopped; its output:"
    cat "$log"
    exit 1
  fi
  took=$(awk -v s="$stopped" -v e="$ended" 'BEGIN { printf "%.2f", e - s }')
  named=$(grep -E "worker $target \([^)]*, pid $stopped_pid\) is stopped" "$log" | head -1)
  if [ "$status" = 0 ] || [ -z "$named" ] ||
    ! awk -v t="$took" -v b="$bound" 'BEGIN { exit !(t <= b) }'; then
    echo "trial $trial: exit status $status after $took s (at most $bound s allowed), worker" \
      "$target (pid $stopped_pid) named: ${named:-no}; the job's output:"
    cat "$log"
    exit 1
  fi
  echo "trial $trial: worker $target (pid $stopped_pid) named after $took s, exit status $status: $named"
  times+=("$took")
done
printf '%s\n' "${times[@]}" | sort -g | awk '{ t[NR] = $1 } END {
  m = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
  printf "%d/%d trials: the stopped worker named and the job ended; median %.2f s, max %.2f s\n", NR, NR, m, t[NR] }'
