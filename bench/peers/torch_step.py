#!/usr/bin/python3
# Python modules: torch (python3-torch, installed by bench/peers/run) and common (beside this script)
"""PyTorch (Debian's python3-torch, GEMMs through OpenBLAS) on bench_step_cpu's configurations:
eager forward + cross-entropy + backward + torch.optim.Adam, float32 (or, with --precision
mixed_bfloat16, the forward and loss under torch.autocast("cpu", torch.bfloat16)), one process.

By default it tries compute threads 1 and 2 under each OPENBLAS_CORETYPE of --coretypes that this
CPU can run (each core type in a process of its own, since OpenBLAS reads it at load time; a core
type whose instructions the CPU lacks, SkylakeX without AVX-512, is left out and said so), and for the
convolutional models both memory formats (NCHW and channels_last), and reports the best setting
per configuration; --threads N --coretype X times one setting.

    /usr/bin/python3 bench/peers/torch_step.py [--configs mlp-b64,...] [--csv]
"""
import os
import subprocess
import sys

import common

CORETYPES = "default,Haswell,SkylakeX"
# The instructions each OpenBLAS core type's kernels use: a core type whose flags the CPU lacks
# dies with SIGILL at its first GEMM.
CORETYPE_FLAGS = {"Haswell": {"avx2", "fma"}, "SkylakeX": {"avx512f", "avx512bw", "avx512vl"}}


def runnable_coretypes(coretypes):
    """(the core types of `coretypes` this CPU can run, the ones it cannot with why)."""
    flags = common.cpu_flags()
    keep, dropped = [], []
    for coretype in coretypes:
        missing = CORETYPE_FLAGS.get(coretype, set()) - flags
        if missing and flags:
            dropped.append(f"{coretype} (this CPU lacks {', '.join(sorted(missing))})")
        else:
            keep.append(coretype)
    return keep, dropped


def extra_args(parser):
    parser.add_argument("--coretypes", default=CORETYPES,
                        help="OPENBLAS_CORETYPE values to try ('default': unset)")
    parser.add_argument("--threads", type=int, default=0,
                        help="time this thread count only (0: try 1 and 2)")
    parser.add_argument("--coretype", default=None,
                        help="time under this OPENBLAS_CORETYPE only, in this process")


def build_resnet(torch):
    nn = torch.nn

    def conv(cin, cout, size, stride):
        return nn.Conv2d(cin, cout, size, stride=stride, padding=size // 2, bias=False)

    def norm(channels):  # Keras's momentum 0.99 is PyTorch's 0.01
        return nn.BatchNorm2d(channels, eps=common.BN_EPSILON, momentum=1 - common.BN_MOMENTUM)

    class Block(nn.Module):
        def __init__(self, cin, filters, stride):
            super().__init__()
            self.body = nn.Sequential(conv(cin, filters, 3, stride), norm(filters), nn.ReLU(),
                                      conv(filters, filters, 3, 1), norm(filters))
            self.shortcut = (nn.Sequential(conv(cin, filters, 1, stride), norm(filters))
                             if stride != 1 else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    layers = [conv(1, 16, 3, 1), norm(16), nn.ReLU()]
    channels = 16
    for filters, stride in common.RESNET_BLOCKS:
        layers.append(Block(channels, filters, stride))
        channels = filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return nn.Sequential(*layers)


def build_gpt(torch, kind):
    """nanoGPT's model (bias=False), attention written out as nanoGPT does without
    F.scaled_dot_product_attention (this PyTorch has none): masked scores, softmax, weighted sum."""
    nn = torch.nn
    layers, heads, embed, block = common.GPT_SHAPES[kind]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(embed, 3 * embed, bias=False)
            self.proj = nn.Linear(embed, embed, bias=False)
            self.register_buffer("mask", torch.tril(torch.ones(block, block)).bool())

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(embed, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / (c // heads) ** 0.5)
            scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(embed, elementwise_affine=True)
            self.attention = Attention()
            self.ln_2 = nn.LayerNorm(embed, elementwise_affine=True)
            self.mlp = nn.Sequential(nn.Linear(embed, 4 * embed, bias=False), nn.GELU(),
                                     nn.Linear(4 * embed, embed, bias=False))

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(common.GPT_VOCABULARY, embed)
            self.positions = nn.Embedding(block, embed)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(embed)
            self.head = nn.Linear(embed, common.GPT_VOCABULARY, bias=False)
            self.head.weight = self.tokens.weight  # tied

        def forward(self, ids):
            t = ids.shape[1]
            x = self.tokens(ids) + self.positions(torch.arange(t))
            return self.head(self.ln_f(self.blocks(x)))

    model = Gpt()
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / (2 * layers) ** 0.5 if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, 0.0, std)
    for module in model.modules():  # layer norms without their bias (nanoGPT's bias=False)
        if isinstance(module, nn.LayerNorm):
            module.bias = None
    return model


def time_gpt(torch, name, args):
    kind, _, batch = common.CONFIGS[name]
    torch.manual_seed(42)
    model = build_gpt(torch, kind)
    x, y = (torch.from_numpy(a) for a in common.synthetic_tokens(batch, common.GPT_SHAPES[kind][3]))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": common.GPT_WEIGHT_DECAY},
         {"params": rest, "weight_decay": 0.0}],
        lr=common.LEARNING_RATE, betas=(common.BETA_1, common.GPT_BETA_2))
    mixed = args.precision == "mixed_bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                     y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), common.GPT_CLIP)
        optimizer.step()
        return loss.item()

    return common.median_step_seconds(step, args.warmup, args.steps)


def build_model(torch, kind):
    nn = torch.nn
    if kind == "resnet":
        model = build_resnet(torch)
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        return model
    if kind == "cnn":
        # fashion_mnist_cnn's model (TensorFlow's tutorial convnet): 5x5 'same' convolutions.
        layers = [nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10)]
    else:
        widths = [784] + common.HIDDEN[kind] + [10]
        layers = [nn.Flatten()]
        for i in range(len(widths) - 1):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i + 2 < len(widths):
                layers.append(nn.ReLU())
    for layer in layers:  # Glorot-uniform kernels and zero biases, as Keras and Tandem
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


def time_config(torch, name, args, channels_last=False):
    kind, _, batch = common.CONFIGS[name]
    if kind in common.GPT_SHAPES:
        return time_gpt(torch, name, args)
    torch.manual_seed(42)
    model = build_model(torch, kind)
    images, labels = common.synthetic_batch(batch)
    x = torch.from_numpy(images)
    if kind in ("cnn", "resnet"):
        x = x.reshape(batch, 1, 28, 28)  # NCHW, PyTorch's layout
        if channels_last:  # NHWC in memory: oneDNN's preferred layout for convolutions
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(labels)
    optimizer = torch.optim.Adam(model.parameters(), lr=common.LEARNING_RATE,
                                 betas=(common.BETA_1, common.BETA_2), eps=common.EPSILON)

    mixed = args.precision == "mixed_bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    return common.median_step_seconds(step, args.warmup, args.steps)


def run_here(args):
    """Times every configuration under this process's OPENBLAS_CORETYPE."""
    import torch
    coretype = os.environ.get("OPENBLAS_CORETYPE", "default")
    report = common.Report(f"PyTorch {torch.__version__} eager on the CPU, {args.precision}, "
                           f"Adam; OPENBLAS_CORETYPE {coretype}", args)
    for name in args.configs:
        convolutional = common.CONFIGS[name][0] in ("cnn", "resnet")
        for threads in [args.threads] if args.threads else [1, 2]:
            torch.set_num_threads(threads)
            for channels_last in [False, True] if convolutional else [False]:
                seconds = time_config(torch, name, args, channels_last)
                layout = " channels_last" if channels_last else ""
                report.row(name, seconds, f"threads={threads} coretype={coretype}{layout}")


def sweep(args):
    """Runs every core type in a child process and keeps each configuration's best row."""
    best = {}
    coretypes, dropped = runnable_coretypes(args.coretypes.split(","))
    for reason in dropped:
        print(f"PyTorch: not timed under OPENBLAS_CORETYPE={reason}", file=sys.stderr)
    args.coretypes = ",".join(coretypes)
    for coretype in coretypes:
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        if coretype != "default":
            env["OPENBLAS_CORETYPE"] = coretype
        command = [sys.executable, os.path.abspath(__file__), "--csv", "--coretype", coretype,
                   "--configs", ",".join(args.configs), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads),
                   "--precision", args.precision]
        out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines()[1:]:
            name, _, _, ms, setting = line.split(",")  # several rows per configuration
            seconds = float(ms) * 1e-3
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, setting)
    return best


def main():
    args = common.parse_args(__doc__.splitlines()[0], extra_args, gpt=True)
    if args.coretype is not None:  # one setting, in this process
        if args.coretype == "default":
            os.environ.pop("OPENBLAS_CORETYPE", None)
        else:
            os.environ["OPENBLAS_CORETYPE"] = args.coretype
        run_here(args)
        return 0
    best = sweep(args)
    import torch
    report = common.Report(
        f"PyTorch {torch.__version__} eager on the CPU, {args.precision}, Adam; best of threads 1 "
        f"and 2 x OPENBLAS_CORETYPE in {args.coretypes}", args)
    for name in args.configs:
        report.row(name, *best[name])
    if not args.csv:
        print("\nreproduce: /usr/bin/python3 " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
