#!/usr/bin/python3
# Python modules: common (beside this script); the peers run in processes of their own
"""Runs bench_step_cpu and the peer scripts round-robin, each run in a process of its own
(the starting contender rotates every round), and prints one table: per configuration the
median over rounds of each contender's samples/s and Tandem's ratio to each peer.
bench/peers/run installs the peers and builds the bench, then calls this.

    /usr/bin/python3 bench/peers/compare.py --bench build/bench/bench_step_cpu \\
        --venv-python build/bench-peers-venv/bin/python [--rounds 3] [--configs ...]
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

PEERS = {  # name -> (table heading, script, runs under the venv's python)
    "torch": ("PyTorch", "torch_step.py", False),
    "tf": ("TensorFlow", "tf_step.py", True),
    "jax": ("JAX", "jax_step.py", True),
}
TANDEM_CONFIGS = ["mlp-b64", "mlp-b256", "large-b256", "cnn-b64", "resnet-b64", "mlp-b64-r2",
                  "mlp-b256-r2"]
# samples/shakespeare_gpt's model (--configs gpt-b12,...; not in the default list): its rows give
# tokens/s. The peers that have it:
GPT_CONFIGS = ["gpt-b12", "gpt-b12-r2", "gpt-large-b12"]
GPT_PEERS = {"torch", "tf", "jax"}
MODELS = {"mlp-b64-r2": "mlp 784-256-128-10", "mlp-b256-r2": "mlp 784-256-128-10",
          "gpt-b12-r2": "gpt 4x4x128, 64 tokens"}
TOKENS = {"gpt-b12-r2": 64}  # tokens per sample of the rows the peers lack


# --isa: the /proc/cpuinfo flags each class needs (a class the CPU lacks is never run), and how
# each contender is capped to it.
ISA_FLAGS = {
    "avx2": {"avx2", "fma", "f16c"},
    "avx512_core": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "avx512_core_bf16": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                         "avx512_bf16"},
    "avx512_core_amx": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                        "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"},
}
XLA_ISA = {"avx2": "AVX2", "avx512_core": "AVX512", "avx512_core_bf16": "AVX512_BF16",
           "avx512_core_amx": "AMX"}
# PyTorch 1.13's ATen kernels come in default, avx2 and avx512 builds; OpenBLAS's core types
# within the cap (SkylakeX: AVX-512; Haswell: AVX2; 'default' may pick a bigger one).
ATEN_ISA = {"avx2": "avx2"}
OPENBLAS_CORETYPES = {"avx2": "Haswell", "avx512_core": "Haswell,SkylakeX"}


def capped_env(env, contender, isa):
    """`env` with contender's instruction set capped at `isa` (None: as is)."""
    if isa is None:
        return env
    env = dict(env)
    xla = f"--xla_cpu_max_isa={XLA_ISA[isa]}"
    if contender.startswith("tandem"):
        env["TANDEM_MAX_CPU_ISA"] = isa
    elif contender == "torch":
        env["ATEN_CPU_CAPABILITY"] = ATEN_ISA.get(isa, "avx512")
        env["ONEDNN_MAX_CPU_ISA"] = isa.upper()
    else:  # TensorFlow (oneDNN, and XLA under jit_compile) and JAX (XLA)
        env["ONEDNN_MAX_CPU_ISA"] = isa.upper()
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla).strip()
    return env


def parse_csv(text):
    lines = [line for line in text.splitlines() if "," in line]
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:]]


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"compare: {shlex.join(command)} failed ({result.returncode}):\n"
                 f"{result.stderr[-3000:]}")
    return parse_csv(result.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="bench_step_cpu")
    parser.add_argument("--venv-python", required=True, help="python with tensorflow and jax")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(TANDEM_CONFIGS))
    parser.add_argument("--steps", type=int, default=common.TIMED_STEPS)
    parser.add_argument("--skip", default="", help="peers to leave out: torch,tf,jax")
    parser.add_argument("--tandem-args", default="", help="more arguments for bench_step_cpu")
    parser.add_argument("--precision", choices=common.PRECISIONS, default="float32",
                        help="every contender's: float32, or mixed_bfloat16 (bfloat16 compute)")
    parser.add_argument("--isa", choices=list(ISA_FLAGS), default=None,
                        help="cap every contender's instruction set (where it allows it)")
    args = parser.parse_args()
    if args.isa:
        missing = ISA_FLAGS[args.isa] - common.cpu_flags()
        if missing:
            parser.error(f"--isa {args.isa}: this CPU lacks {', '.join(sorted(missing))}; "
                         f"a cap can only lower the instruction set")
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in TANDEM_CONFIGS + GPT_CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {TANDEM_CONFIGS + GPT_CONFIGS}")
    peer_configs = [c for c in configs if c in common.CONFIGS]
    peers = [p for p in PEERS if p not in args.skip.split(",")]
    steps = ["--steps", str(args.steps), "--warmup", str(common.WARMUP_STEPS),
             "--precision", args.precision]

    # Tandem at its default thread count (cores / replicas), and its one-replica rows again at
    # one thread: PyTorch gets the better of 1 and 2 threads, so Tandem does too.
    tandem = [args.bench, "--csv"] + steps + shlex.split(args.tandem_args)
    commands = {"tandem": tandem + ["--configs", ",".join(configs)]}
    if peer_configs and "--threads" not in args.tandem_args:
        commands["tandem-t1"] = tandem + ["--configs", ",".join(peer_configs), "--threads", "1"]
    for peer in peers:
        _, script, in_venv = PEERS[peer]
        python = args.venv_python if in_venv else "/usr/bin/python3"
        mine = [c for c in peer_configs if peer in GPT_PEERS or c not in GPT_CONFIGS]
        if mine:
            commands[peer] = [python, os.path.join(HERE, script), "--csv", "--configs",
                              ",".join(mine)] + steps
            if peer == "torch" and args.isa in OPENBLAS_CORETYPES:
                commands[peer] += ["--coretypes", OPENBLAS_CORETYPES[args.isa]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

    samples = defaultdict(list)   # (contender, config) -> samples/s per round
    settings = defaultdict(list)  # (contender, config) -> setting per round
    gemm_fraction = defaultdict(list)  # config -> Tandem's GEMM fraction per round
    tandem_rows = defaultdict(list)    # (round, config) -> bench_step_cpu's rows
    replicas, batches = {}, {}
    contenders = list(commands)
    load_start, start = os.getloadavg()[0], time.time()
    for round_index in range(args.rounds):
        order = contenders[round_index % len(contenders):] + \
            contenders[:round_index % len(contenders)]
        for contender in order:
            print(f"[peers] round {round_index + 1}/{args.rounds}: {contender}", file=sys.stderr,
                  flush=True)
            for row in run(commands[contender], capped_env(env, contender, args.isa)):
                config = row["config"]
                batches[config] = int(row["batch"])
                if contender.startswith("tandem"):
                    replicas[config] = int(row["replicas"])
                    tandem_rows[(round_index, config)].append(row)
                else:
                    samples[(contender, config)].append(float(row["samples_per_s"]))
                    settings[(contender, config)].append(row["setting"])
        # This round's Tandem figure per configuration: the better thread count, as PyTorch's.
        for config in configs:
            rows = tandem_rows[(round_index, config)]
            best = max(rows, key=lambda row: float(row["samples_per_s"]))
            samples[("tandem", config)].append(float(best["samples_per_s"]))
            gemm_fraction[config].append(float(best["gemm_fraction"]))
            settings[("tandem", config)].append(f"threads={best['threads']}")
            default = rows[0]  # the run without --threads
            samples[("tandem-default", config)].append(float(default["samples_per_s"]))

    names = [PEERS[p][0] for p in peers]
    if args.isa:
        print(f"instruction set capped at {args.isa}: Tandem by TANDEM_MAX_CPU_ISA; PyTorch by "
              f"ATEN_CPU_CAPABILITY={ATEN_ISA.get(args.isa, 'avx512')}, OPENBLAS_CORETYPE in "
              f"{OPENBLAS_CORETYPES.get(args.isa, 'the default set')} and ONEDNN_MAX_CPU_ISA; "
              f"TensorFlow by ONEDNN_MAX_CPU_ISA and XLA's --xla_cpu_max_isa={XLA_ISA[args.isa]} "
              f"(its Eigen kernels run as the wheel was built: not capped); JAX by "
              f"--xla_cpu_max_isa={XLA_ISA[args.isa]}\n")
    print(f"CPU training step, {args.precision}, Adam (GPT: AdamW with clipping), synthetic data: "
          f"samples/s (GPT: tokens/s), median over "
          f"{args.rounds} interleaved rounds (each: median of {args.steps} steps after "
          f"{common.WARMUP_STEPS}); ratio = Tandem / peer (> 1: Tandem faster)\n")
    heading = (f"{'config':<12} {'model':<24} {'batch':>5} {'rep':>3} {'Tandem':>9} "
               f"{'default':>9} {'of_gemm':>7}")
    heading += "".join(f" {n:>10}" for n in names) + "".join(f" {'vs ' + n:>13}" for n in names)
    print(heading)
    for config in configs:
        model = common.CONFIGS[config][1] if config in common.CONFIGS else MODELS[config]
        # A GPT's samples are sequences: its rows give tokens/s.
        unit = TOKENS.get(config) or (common.tokens_per_sample(config)
                                      if config in common.CONFIGS else 1)
        for key in list(samples):
            if key[1] == config and not key[0].endswith("-scaled"):
                samples[(key[0] + "-scaled", config)] = [v * unit for v in samples[key]]
        tandem = statistics.median(samples[("tandem-scaled", config)])
        default = statistics.median(samples[("tandem-default-scaled", config)])
        line = (f"{config:<12} {model:<24} {batches[config]:>5} {replicas[config]:>3} "
                f"{tandem:>9.0f} {default:>9.0f} {statistics.median(gemm_fraction[config]):>7.2f}")
        peer_values = [statistics.median(samples[(p + "-scaled", config)])
                       if samples[(p + "-scaled", config)] else None for p in peers]
        line += "".join(f" {v:>10.0f}" if v else f" {'-':>10}" for v in peer_values)
        line += "".join(f" {tandem / v:>12.2f}x" if v else f" {'-':>13}" for v in peer_values)
        print(line)

    print("\nsettings (most frequent per contender and configuration):")
    for contender in ["tandem"] + peers:
        chosen = [f"{c}: {Counter(settings[(contender, c)]).most_common(1)[0][0]}"
                  for c in configs if settings[(contender, c)]]
        print(f"  {contender}: " + "; ".join(chosen))
    print("\nrep = CPU replicas (MirroredStrategy); Tandem = the better of its default threads "
          "(cores / replicas) and 1 thread per round, default = the default alone; of_gemm = "
          "the GEMMs the step needs, alone / Tandem's step time (resnet: its batch norms "
          "alone); PyTorch = the best of threads 1 and 2 x OPENBLAS_CORETYPE (and, for the "
          "convolutional models, NCHW or channels_last) per round; TensorFlow (the better of "
          "tf.function with jit_compile off and on) and JAX at their default thread pools")
    print(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
          f"({time.time() - start:.0f} s); cores: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
