#!/usr/bin/env python3
"""PyTorch eager baseline for bench_gpu_step: the same MLPs, batches and optimizers, float32,
TF32 off, timed the same way (CUDA events around each step, median of 60 after 10 warm-up
steps; pipelined = mean of 60 steps queued back to back), printed in the same table format.

    python3 bench/gpu_step_torch.py [--precision float32|mixed_bfloat16]

--precision mixed_bfloat16: the step under torch.autocast("cuda", torch.bfloat16) (float32
parameters and optimizer, bfloat16 matrix products), as bench_gpu_step --precision
mixed_bfloat16.
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the GPU machines carry PyTorch; elsewhere: python3-torch (CPU only)
    sys.exit(f"gpu_step_torch.py needs PyTorch with CUDA: {e}")

WARMUP_STEPS = 10
TIMED_STEPS = 60
GEMM_ROUNDS = 20
GEMM_SAMPLES = 7

CONFIGS = [
    ("mlp 784-256-128-10", [784, 256, 128, 10], 64),
    ("mlp 784-256-128-10", [784, 256, 128, 10], 256),
    ("mlp 784-4096x4-10", [784, 4096, 4096, 4096, 4096, 10], 1024),
]


def make_model(widths, device):
    torch.manual_seed(42)
    layers = []
    for i in range(len(widths) - 1):
        linear = torch.nn.Linear(widths[i], widths[i + 1])
        # Glorot-uniform kernels and zero biases, as the Tandem benchmark initialises them.
        torch.nn.init.xavier_uniform_(linear.weight)
        torch.nn.init.zeros_(linear.bias)
        layers.append(linear)
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def time_steps(step):
    for _ in range(WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(TIMED_STEPS):
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    start.record()
    for _ in range(TIMED_STEPS):
        step()
    stop.record()
    stop.synchronize()
    pipelined = start.elapsed_time(stop) / TIMED_STEPS
    times.sort()
    return times[len(times) // 2], times[len(times) * 9 // 10], pipelined


def step_gemms(widths, batch):
    """Per layer Y = X W, dX = dY W^T, dW = X^T dY, as (transpose_a, transpose_b, m, n, k)."""
    gemms = []
    for i in range(len(widths) - 1):
        fan_in, fan_out = widths[i], widths[i + 1]
        gemms += [(False, False, batch, fan_out, fan_in), (False, True, batch, fan_in, fan_out),
                  (True, False, fan_in, fan_out, batch)]
    return gemms


def gemm_tflops(gemms, device):
    operands = []
    for ta, tb, m, n, k in gemms:
        a = torch.rand((k, m) if ta else (m, k), device=device)
        b = torch.rand((n, k) if tb else (k, n), device=device)
        operands.append((a.t() if ta else a, b.t() if tb else b))

    def one_pass():
        for a, b in operands:
            torch.mm(a, b)

    for _ in range(3):
        one_pass()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(GEMM_SAMPLES):
        start.record()
        for _ in range(GEMM_ROUNDS):
            one_pass()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / GEMM_ROUNDS)
    samples.sort()
    flops = sum(2.0 * m * n * k for _, _, m, n, k in gemms)
    return flops, flops / (samples[len(samples) // 2] * 1e-3) * 1e-12


def main():
    precision = "float32"
    if len(sys.argv) == 3 and sys.argv[1] == "--precision" and sys.argv[2] in (
            "float32", "mixed_bfloat16"):
        precision = sys.argv[2]
    elif len(sys.argv) != 1:
        sys.exit("usage: gpu_step_torch.py [--precision float32|mixed_bfloat16]")
    mixed = precision == "mixed_bfloat16"
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda:0")
    print(f"PyTorch {torch.__version__} eager training step on cuda:0 "
          f"({torch.cuda.get_device_name(0)}), {precision}, TF32 off, median of {TIMED_STEPS} steps "
          f"after {WARMUP_STEPS}")
    print("step = forward + cross-entropy (mean) + backward + optimizer update; "
          f"pipelined = mean of {TIMED_STEPS} steps queued back to back\n")
    print(f"{'model':<22} {'batch':>6} {'optimizer':<9} {'median_ms':>10} {'p90_ms':>10} "
          f"{'pipelined_ms':>13} {'steps/s':>9}")
    for name, widths, batch in CONFIGS:
        for optimizer_name in ("sgd", "adam"):
            model = make_model(widths, device)
            generator = torch.Generator(device=device).manual_seed(1)
            features = torch.rand((batch, widths[0]), device=device, generator=generator)
            labels = torch.randint(0, widths[-1], (batch,), device=device, generator=generator)
            if optimizer_name == "sgd":
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            else:
                # Keras' (and Tandem's) default epsilon.
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)

            def step():
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
                    logits = model(features)
                loss = F.cross_entropy(logits.float(), labels)
                loss.backward()
                optimizer.step()

            median, p90, pipelined = time_steps(step)
            print(f"{name:<22} {batch:>6} {optimizer_name:<9} {median:>10.3f} {p90:>10.3f} "
                  f"{pipelined:>13.3f} {1000.0 / median:>9.0f}", flush=True)

    print(f"\nGEMMs of one step (per layer Y=XW, dX=dY W^T, dW=X^T dY) through torch.mm, "
          f"{GEMM_ROUNDS} passes per sample, median of {GEMM_SAMPLES}\n")
    print(f"{'model':<22} {'batch':>6} {'gemms':>6} {'GFLOP/step':>11} {'torch_TFLOP/s':>15}")
    for name, widths, batch in CONFIGS:
        gemms = step_gemms(widths, batch)
        flops, tflops = gemm_tflops(gemms, device)
        print(f"{name:<22} {batch:>6} {len(gemms):>6} {flops * 1e-9:>11.3f} {tflops:>15.2f}",
              flush=True)
    print("\nreproduce: python3 " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
