#!/usr/bin/env bash
# The [mpi] test program on two "hosts": two network namespaces joined by a veth pair, one
# worker in each, so every cross-worker byte crosses a real network interface (Open MPI's TCP
# transport; no shared memory). mpirun starts one orted per namespace through an rsh agent, as
# it would over ssh on two machines, and each namespace has its own hostname.
#
#   two_hosts_veth.sh MPIRUN TEST_PROGRAM [test program arguments...]
#   two_hosts_veth.sh tf_config TEST_PROGRAM [...]   (no mpirun: each worker from its TF_CONFIG)
#
# Passes when every test case passes on both workers and the veth carried at least 1 MiB each
# way. Exits 77 (CTest's skip code) when namespaces cannot be made here (no CAP_NET_ADMIN).
#
# TANDEM_VETH_RATE (e.g. 5gbit): limits each direction of the link to that rate with a token
# bucket filter (tc qdisc tbf), a network slower than memory (bench/overlap_veth.sh).
# TANDEM_VETH_PIN=1: worker A runs on CPU 0 and worker B on CPU 1, like two one-core hosts.
set -euo pipefail

mpirun="$1"
program="$2"
shift 2

say() { printf '[two_hosts_veth] %s\n' "$*"; }

# Names unique to this run, so parallel runs do not meet (interface names: 15 characters).
id=$$
ns_a="tandem-$id-a"
ns_b="tandem-$id-b"
dev_a="tdv${id}a"
dev_b="tdv${id}b"
subnet_byte=$((id % 250 + 1))
addr_a="10.231.$subnet_byte.1"
addr_b="10.231.$subnet_byte.2"
subnet="10.231.$subnet_byte.0/24"
scratch="$(mktemp -d /tmp/tandem-veth.XXXXXX)"

cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

if ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
  say "SKIP: needs ip (iproute2) and unshare (util-linux)"
  exit 77
fi
if ! error="$(ip netns add "$ns_a" 2>&1)"; then
  say "SKIP: cannot create a network namespace here (needs root with CAP_NET_ADMIN): $error"
  exit 77
fi
ip netns add "$ns_b"
ip link add "$dev_a" type veth peer name "$dev_b"
ip link set "$dev_a" netns "$ns_a"
ip link set "$dev_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$dev_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$dev_b"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$dev_a" up
ip -n "$ns_b" link set "$dev_b" up
say "hosts $ns_a ($addr_a, $dev_a) and $ns_b ($addr_b, $dev_b), joined by a veth pair"
if [[ -n "${TANDEM_VETH_RATE:-}" ]]; then
  # A small bucket (1 MiB), so that a step's tens of MiB go at the rate, not in one burst.
  ip netns exec "$ns_a" tc qdisc add dev "$dev_a" root tbf rate "$TANDEM_VETH_RATE" \
    burst 1mb latency 400ms
  ip netns exec "$ns_b" tc qdisc add dev "$dev_b" root tbf rate "$TANDEM_VETH_RATE" \
    burst 1mb latency 400ms
  say "each direction limited to $TANDEM_VETH_RATE (tc tbf)"
fi
pin_a="" pin_b="" bind=()
if [[ "${TANDEM_VETH_PIN:-0}" == 1 ]]; then
  pin_a="taskset -c 0" pin_b="taskset -c 1" bind=(--bind-to none)
fi

# The rsh agent: mpirun calls it as `agent HOST COMMAND...`, like ssh. HOST names a namespace;
# the command runs there with its own UTS namespace whose hostname is HOST.
cat >"$scratch/agent" <<EOF
#!/bin/sh
host="\$1"; shift
pin=""
[ "\$host" = "$ns_a" ] && pin="$pin_a"
[ "\$host" = "$ns_b" ] && pin="$pin_b"
exec ip netns exec "\$host" unshare --uts \$pin /bin/sh -c "hostname \$host; \$*"
EOF
chmod +x "$scratch/agent"
printf '%s slots=1\n%s slots=1\n' "$ns_a" "$ns_b" >"$scratch/hosts"

bytes() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/$3"; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
if [[ "$mpirun" == tf_config ]]; then
  # No launcher: each host starts its worker with its own TF_CONFIG (worker B first, so that
  # it waits for the chief), as tf.distribute users start theirs.
  cluster="{\"worker\": [\"$addr_a:23456\", \"$addr_b:23456\"]}"
  ip netns exec "$ns_b" unshare --uts /bin/sh -c "hostname $ns_b; exec \"\$0\" \"\$@\"" \
    $pin_b env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
    "$program" "$@" >"$scratch/worker1.log" 2>&1 &
  worker_b=$!
  sleep 0.5
  ip netns exec "$ns_a" unshare --uts /bin/sh -c "hostname $ns_a; exec \"\$0\" \"\$@\"" \
    $pin_a env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
    "$program" "$@" >"$scratch/worker0.log" 2>&1 || status=$?
  wait "$worker_b" || status=$?
  sed 's/^/[worker 0] /' "$scratch/worker0.log"
  sed 's/^/[worker 1] /' "$scratch/worker1.log"
else
ip netns exec "$ns_a" "$mpirun" \
  --mca plm_rsh_agent "$scratch/agent" --hostfile "$scratch/hosts" -np 2 "${bind[@]}" \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  -x TANDEM_TEST_LOCAL_REPLICAS -x TANDEM_LOG_LEVEL -x TANDEM_COLLECTIVE_TIMEOUT \
  -x TANDEM_CPU_REPLICAS \
  -x OMP_NUM_THREADS \
  "$program" "$@" || status=$?
fi

sent="$(bytes "$ns_a" "$dev_a" tx_bytes)"
received="$(bytes "$ns_a" "$dev_a" rx_bytes)"
say "$dev_a sent $sent bytes and received $received bytes"
if [[ $status -ne 0 ]]; then
  say "FAILED: the workers exited with $status"
  exit 1
fi
if ((sent < 1048576 || received < 1048576)); then
  say "FAILED: less than 1 MiB crossed the veth pair each way; the workers talked some other way"
  exit 1
fi
say "passed: both workers' tests passed over the veth pair"
