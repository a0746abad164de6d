#!/usr/bin/python3
# Python modules: torch and numpy (python3-torch; bench/shared_cores.sh installs it)
"""PyTorch (Debian's python3-torch) on the fashion_mnist_mlp sample's whole job: the same model
(784-256-128-10, ReLU, Glorot-uniform kernels), Adam at 0.001, batch 64, Fashion-MNIST from
/usr/share/datasets/fashion-mnist shuffled every epoch, eager, one process. Prints each epoch's
samples/s for compute threads 1 and 2 (torch.set_num_threads) and the best last epoch:

    /usr/bin/python3 bench/peers/torch_epoch.py [--epochs 2] [--batch 64] [--threads 1,2]
"""
import argparse
import gzip
import time

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"


def load(name, offset):
    with gzip.open(f"{DATA}/{name}", "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def model():
    layers = [torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
              torch.nn.ReLU(), torch.nn.Linear(128, 10)]
    for layer in layers:
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)
    return torch.nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    images = torch.from_numpy(load("train-images-idx3-ubyte.gz", 16).reshape(-1, 784)
                              .astype(np.float32) / 255.0)
    labels = torch.from_numpy(load("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    best = 0.0
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        torch.manual_seed(42)
        net = model()
        optimizer = torch.optim.Adam(net.parameters(), lr=0.001)
        loss_fn = torch.nn.CrossEntropyLoss()
        n = images.shape[0] - images.shape[0] % args.batch
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(images.shape[0])
            start = time.perf_counter()
            for first in range(0, n, args.batch):
                index = order[first:first + args.batch]
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(net(images[index]), labels[index])
                loss.backward()
                optimizer.step()
            rate = n / (time.perf_counter() - start)
            print(f"threads {threads} epoch {epoch}/{args.epochs}: {rate:.0f} samples/s",
                  flush=True)
        best = max(best, rate)
    print(f"best last epoch: {best:.0f} samples/s")


if __name__ == "__main__":
    main()
