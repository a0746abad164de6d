"""What the peer step benchmarks share with bench_step_cpu: the configurations, the synthetic
data, the timing (median of per-step wall times after warm-up) and the output formats.

Every peer times WARMUP_STEPS untimed steps, then TIMED_STEPS steps each timed on its own, and
reports the median; each step ends with its loss on the host (a value, not a pending future),
so asynchronous runtimes are timed to completion.
"""
import argparse
import time

import numpy as np

WARMUP_STEPS = 10
TIMED_STEPS = 60

# Adam as Keras (and Tandem) default it.
LEARNING_RATE = 1e-3
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7

# name -> (model, description, global batch). The names are bench_step_cpu's; its 2-replica
# rows have no peer counterpart here.
CONFIGS = {
    "mlp-b64": ("mlp", "mlp 784-256-128-10", 64),
    "mlp-b256": ("mlp", "mlp 784-256-128-10", 256),
    "large-b256": ("large", "mlp 784-1024x2-10", 256),
    "cnn-b64": ("cnn", "cnn (fashion_mnist_cnn)", 64),
    "resnet-b64": ("resnet", "resnet (fashion_mnist_resnet)", 64),
    # samples/shakespeare_gpt's model: the batch counts sequences of GPT_SHAPES' block tokens.
    "gpt-b12": ("gpt", "gpt 4x4x128, 64 tokens", 12),
    "gpt-large-b12": ("gpt-large", "gpt 6x6x384, 256 tokens", 12),
}
# The GPTs (nanoGPT's shakespeare_char recipes, CPU and larger): layers, heads, embedding, block
# (context length); a vocabulary of the Shakespeare corpus's 84 characters; no biases, layer
# norm epsilon 1e-5, GELU (erf), the output layer tied to the token embedding. They train with
# AdamW (learning rate 1e-3, beta_2 0.99, weight decay 0.1) and clipping at global norm 1.0.
GPT_SHAPES = {"gpt": (4, 4, 128, 64), "gpt-large": (6, 6, 384, 256)}
GPT_VOCABULARY = 84
GPT_BETA_2, GPT_WEIGHT_DECAY, GPT_CLIP = 0.99, 0.1, 1.0
# Hidden widths of the MLPs (input 784 = 28 x 28, 10 classes).
HIDDEN = {"mlp": [256, 128], "large": [1024, 1024]}
# fashion_mnist_resnet's model: a 3x3 convolution of 16 filters (no bias), batch norm, ReLU, then
# residual blocks (filters, stride): conv 3x3 (stride) - BN - ReLU - conv 3x3 - BN, plus the
# input (a 1x1 convolution with the stride and a BN where the shape changes), ReLU; global
# average pooling; Dense(10). Batch norm as Keras's: momentum 0.99, epsilon 1e-3.
RESNET_BLOCKS = [(16, 1), (32, 2), (64, 2)]
BN_MOMENTUM, BN_EPSILON = 0.99, 1e-3
CSV_HEADER = "config,batch,samples_per_s,ms_per_step,setting"
PRECISIONS = ["float32", "mixed_bfloat16"]


def cpu_flags():
    """The instruction-set flags of this machine's CPU (/proc/cpuinfo), an empty set elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def synthetic_batch(batch):
    """Images [batch, 28, 28] in [0, 1) and labels [batch] in [0, 10), fixed seed."""
    rng = np.random.default_rng(1)
    images = rng.random((batch, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, size=batch).astype(np.int64)
    return images, labels


def tokens_per_sample(name):
    """Tokens in one sample of configuration `name`: a GPT's block, 1 for the image models."""
    kind = CONFIGS[name][0]
    return GPT_SHAPES[kind][3] if kind in GPT_SHAPES else 1


def synthetic_tokens(batch, block):
    """Token windows x [batch, block] and their next tokens y, int64 in [0, GPT_VOCABULARY)."""
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, GPT_VOCABULARY, size=(batch, block + 1)).astype(np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def median_step_seconds(step, warmup=WARMUP_STEPS, timed=TIMED_STEPS):
    """step() runs one training step and returns once its loss is on the host."""
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(timed):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return seconds[len(seconds) // 2]


def parse_args(description, extra=None, gpt=False):
    """The peers' common flags; `gpt`: the script has the GPT configurations too."""
    known = [c for c in CONFIGS if gpt or CONFIGS[c][0] not in GPT_SHAPES]
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--configs", default=",".join(known),
                        help="comma-separated subset of: " + " ".join(known))
    parser.add_argument("--steps", type=int, default=TIMED_STEPS, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=WARMUP_STEPS, help="untimed steps first")
    parser.add_argument("--csv", action="store_true", help="print " + CSV_HEADER)
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="float32, or mixed_bfloat16: float32 weights and optimizer, the "
                             "layers computing in bfloat16 (each framework's own way)")
    if extra:
        extra(parser)
    args = parser.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in known]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {known}")
    return args


class Report:
    """Prints one row per configuration, as a table or as CSV lines."""

    def __init__(self, title, args):
        self.csv = args.csv
        if self.csv:
            print(CSV_HEADER, flush=True)
        else:
            print(title)
            print(f"synthetic data; median of {args.steps} steps after {args.warmup}, each "
                  "ending with the loss on the host\n")
            print(f"{'config':<12} {'model':<24} {'batch':>6} {'samples/s':>12} {'step_ms':>9}"
                  f"  setting")

    def row(self, name, seconds, setting=""):
        _, description, batch = CONFIGS[name]
        if self.csv:
            print(f"{name},{batch},{batch / seconds:.1f},{seconds * 1e3:.4f},{setting}",
                  flush=True)
        else:
            print(f"{name:<12} {description:<24} {batch:>6} {batch / seconds:>12.0f} "
                  f"{seconds * 1e3:>9.3f}  {setting}", flush=True)
