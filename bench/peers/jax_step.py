#!/usr/bin/env python3
# Python modules: jax, optax (bench/peers/run's venv) and common (beside this script)
"""JAX (jax[cpu], optax) on bench_step_cpu's configurations: the whole step (forward +
cross-entropy + grad + optax.adam update) in one jax.jit, compiled by XLA, parameters and
optimizer state donated; float32, or with --precision mixed_bfloat16 float32 parameters cast to
bfloat16 for the forward (inputs too; logits back to float32 for the loss). XLA's default CPU
thread pool (all cores).

    build/bench-peers-venv/bin/python bench/peers/jax_step.py [--configs mlp-b64,...] [--csv]
"""
import sys

import common
import jax
import jax.numpy as jnp
import numpy as np
import optax


def glorot(key, shape, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, jnp.float32, -limit, limit)


def init_params(kind, key):
    """Glorot-uniform kernels, zero biases: [(kernel, bias), ...] in layer order."""
    if kind == "cnn":
        # fashion_mnist_cnn's model (TensorFlow's tutorial convnet): 5x5 'same' conv kernels HWIO
        # (fans: 5 x 5 x in, 5 x 5 x out), then the two Dense layers.
        shapes = [(5, 5, 1, 32), (5, 5, 32, 64), (7 * 7 * 64, 1024), (1024, 10)]
    else:
        widths = [784] + common.HIDDEN[kind] + [10]
        shapes = list(zip(widths[:-1], widths[1:]))
    params = []
    for shape in shapes:
        key, sub = jax.random.split(key)
        receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
        params.append((glorot(sub, shape, shape[-2] * receptive, shape[-1] * receptive),
                       jnp.zeros((shape[-1],), jnp.float32)))
    return params


def max_pool_2x2(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


DROPOUT_RATE = 0.4  # the CNN's, after its 1024-wide layer


def forward(kind, params, x, key):
    if kind == "cnn":
        for kernel, bias in params[:2]:
            x = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            x = max_pool_2x2(jax.nn.relu(x + bias))
        dense = params[2:]
    else:
        dense = params
    x = x.reshape(x.shape[0], -1)
    for i, (kernel, bias) in enumerate(dense):
        x = x @ kernel + bias
        if i + 1 < len(dense):
            x = jax.nn.relu(x)
            if kind == "cnn":  # training-mode dropout, as the other contenders
                keep = jax.random.bernoulli(key, 1.0 - DROPOUT_RATE, x.shape)
                x = jnp.where(keep, x / (1.0 - DROPOUT_RATE), 0.0)
    return x


def time_config(name, args):
    kind, _, batch = common.CONFIGS[name]
    params = init_params(kind, jax.random.PRNGKey(42))
    optimizer = optax.adam(common.LEARNING_RATE, b1=common.BETA_1, b2=common.BETA_2,
                           eps=common.EPSILON)
    opt_state = optimizer.init(params)
    images, labels = common.synthetic_batch(batch)
    if kind == "cnn":
        images = images.reshape(batch, 28, 28, 1)  # NHWC, as the Tandem sample
    x, y = jnp.asarray(images), jnp.asarray(labels.astype(np.int32))

    mixed = args.precision == "mixed_bfloat16"

    def loss_fn(params, x, y, key):
        if mixed:  # float32 masters, bfloat16 compute (the cast's gradient comes back float32)
            params = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)
            x = x.astype(jnp.bfloat16)
        logits = forward(kind, params, x, key).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_step(params, opt_state, key, x, y):
        key, dropout_key = jax.random.split(key)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, dropout_key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, key, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    state = [params, opt_state, jax.random.PRNGKey(7)]

    def step():
        state[0], state[1], state[2], loss = step_fn(state[0], state[1], state[2], x, y)
        jax.block_until_ready(state)  # the update too, not only the loss
        return float(loss)

    return common.median_step_seconds(step, args.warmup, args.steps)


def main():
    args = common.parse_args(__doc__.splitlines()[0])
    report = common.Report(
        f"JAX {jax.__version__} (optax {optax.__version__}) on the CPU, {args.precision}, Adam; "
        "the whole step in one jax.jit", args)
    for name in args.configs:
        report.row(name, time_config(name, args), f"devices={jax.device_count()}")
    if not args.csv:
        print("\nreproduce: build/bench-peers-venv/bin/python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
