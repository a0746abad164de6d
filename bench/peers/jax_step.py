#!/usr/bin/env python3
# Python modules: jax, optax (bench/peers/run's venv) and common (beside this script)
"""JAX (jax[cpu], optax) on bench_step_cpu's configurations: the whole step (forward +
cross-entropy + grad + optax.adam update; the GPTs: optax.adamw after clip_by_global_norm) in one
jax.jit, compiled by XLA, parameters and optimizer state donated; float32, or with --precision
mixed_bfloat16 float32 parameters cast to bfloat16 for the forward (inputs too; logits back to
float32 for the loss). XLA's default CPU thread pool (all cores).

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


def conv_kernel(key, size, cin, cout):
    fan = size * size
    return glorot(key, (size, size, cin, cout), fan * cin, fan * cout)


def init_resnet(key):
    """fashion_mnist_resnet's model: (params, batch-norm state). params["convs"] and
    params["dense"] are what mixed precision casts; params["norms"] holds (gamma, beta) per batch
    norm, state the moving (mean, variance), in the order forward_resnet uses them."""
    keys = iter(jax.random.split(key, 32))
    convs, norms, state = [], [], []

    def add_conv(size, cin, cout):
        convs.append(conv_kernel(next(keys), size, cin, cout))

    def add_norm(channels):
        norms.append((jnp.ones((channels,)), jnp.zeros((channels,))))
        state.append((jnp.zeros((channels,)), jnp.ones((channels,))))

    add_conv(3, 1, 16), add_norm(16)
    channels = 16
    for filters, stride in common.RESNET_BLOCKS:
        add_conv(3, channels, filters), add_norm(filters)
        add_conv(3, filters, filters), add_norm(filters)
        if stride != 1:
            add_conv(1, channels, filters), add_norm(filters)
        channels = filters
    dense = (glorot(next(keys), (channels, 10), channels, 10), jnp.zeros((10,), jnp.float32))
    return {"convs": convs, "norms": norms, "dense": dense}, state


def batch_norm(x, norm, moving):
    """Training mode over N, H, W in float32 (as Keras under a mixed policy); returns the
    output in x's dtype and the updated moving statistics."""
    gamma, beta = norm
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=(0, 1, 2))
    variance = jnp.square(xf - mean).mean(axis=(0, 1, 2))
    y = (xf - mean) * jax.lax.rsqrt(variance + common.BN_EPSILON) * gamma + beta
    m = common.BN_MOMENTUM
    updated = tuple(jax.lax.stop_gradient(old * m + new * (1 - m))
                    for old, new in zip(moving, (mean, variance)))
    return y.astype(x.dtype), updated


def forward_resnet(params, state, x):
    convs, norms = iter(params["convs"]), iter(zip(params["norms"], state))
    new_state = []

    def conv(x, stride):
        return jax.lax.conv_general_dilated(x, next(convs), (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def norm(x):
        y, updated = batch_norm(x, *next(norms))
        new_state.append(updated)
        return y

    x = jax.nn.relu(norm(conv(x, 1)))
    for _, stride in common.RESNET_BLOCKS:
        y = jax.nn.relu(norm(conv(x, stride)))
        y = norm(conv(y, 1))
        shortcut = norm(conv(x, stride)) if stride != 1 else x
        x = jax.nn.relu(y + shortcut)
    kernel, bias = params["dense"]
    return x.mean(axis=(1, 2)) @ kernel + bias, new_state


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


def time_resnet(name, args):
    _, _, batch = common.CONFIGS[name]
    params, state = init_resnet(jax.random.PRNGKey(42))
    optimizer = optax.adam(common.LEARNING_RATE, b1=common.BETA_1, b2=common.BETA_2,
                           eps=common.EPSILON)
    opt_state = optimizer.init(params)
    images, labels = common.synthetic_batch(batch)
    x = jnp.asarray(images.reshape(batch, 28, 28, 1))
    y = jnp.asarray(labels.astype(np.int32))
    mixed = args.precision == "mixed_bfloat16"

    def loss_fn(params, state, x, y):
        if mixed:  # convolutions and the dense layer in bfloat16; batch norm in float32
            params = dict(params)
            for key in ("convs", "dense"):
                params[key] = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16),
                                                     params[key])
            x = x.astype(jnp.bfloat16)
        logits, new_state = forward_resnet(params, state, x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
        return loss.mean(), new_state

    def train_step(params, opt_state, state, x, y):
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, state, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    carried = [params, opt_state, state]

    def step():
        carried[0], carried[1], carried[2], loss = step_fn(carried[0], carried[1], carried[2], x,
                                                           y)
        jax.block_until_ready(carried)  # the update and the moving statistics too
        return float(loss)

    return common.median_step_seconds(step, args.warmup, args.steps)


def init_gpt(kind, key):
    """nanoGPT's model (bias=False), as torch_step's build_gpt: normal(0.02) matrices, the
    residual branches' last layers (attention projection, the MLP's second layer) normal(0.02 /
    sqrt(2 layers)), layer-norm scales 1. Kernels are [in, out]; "qkv" is the query, key and
    value kernels side by side (torch's one Linear), each one's columns head after head."""
    layers, _, embed, block = common.GPT_SHAPES[kind]
    keys = iter(jax.random.split(key, 2 + 4 * layers))
    residual = 0.02 / np.sqrt(2 * layers)

    def normal(shape, std=0.02):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    blocks = [{"ln_1": jnp.ones((embed,)), "qkv": normal((embed, 3 * embed)),
               "proj": normal((embed, embed), residual), "ln_2": jnp.ones((embed,)),
               "fc": normal((embed, 4 * embed)), "out": normal((4 * embed, embed), residual)}
              for _ in range(layers)]
    return {"tokens": normal((common.GPT_VOCABULARY, embed)), "positions": normal((block, embed)),
            "blocks": blocks, "ln_f": jnp.ones((embed,))}


def layer_norm(x, scale):
    """No bias, epsilon 1e-5, in float32 (as Keras and torch.autocast under mixed precision);
    the result in x's dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=-1, keepdims=True)
    variance = jnp.square(xf - mean).mean(axis=-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(variance + 1e-5) * scale).astype(x.dtype)


def forward_gpt(params, ids, heads):
    """Logits [batch, block, vocabulary] of token ids [batch, block]: pre-norm blocks with causal
    attention (masked scores, softmax in float32, weighted sum), GELU (erf) MLPs, the output
    through the token embedding."""
    b, t = ids.shape
    x = params["tokens"][ids] + params["positions"][:t]
    c = x.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))

    def split_heads(z):  # [b, t, c] -> [b, heads, t, c / heads]
        return z.reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3)

    for layer in params["blocks"]:
        q, k, v = map(split_heads, jnp.split(layer_norm(x, layer["ln_1"]) @ layer["qkv"], 3, -1))
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(c // heads))
        scores = jnp.where(causal, scores.astype(jnp.float32), -jnp.inf)
        y = jax.nn.softmax(scores, axis=-1).astype(x.dtype) @ v
        x = x + y.transpose(0, 2, 1, 3).reshape(b, t, c) @ layer["proj"]
        h = jax.nn.gelu(layer_norm(x, layer["ln_2"]) @ layer["fc"], approximate=False)
        x = x + h @ layer["out"]
    return layer_norm(x, params["ln_f"]) @ params["tokens"].T


def time_gpt(name, args):
    kind, _, batch = common.CONFIGS[name]
    _, heads, _, block = common.GPT_SHAPES[kind]
    params = init_gpt(kind, jax.random.PRNGKey(42))

    def matrices(params):  # weight decay's mask: not the layer norms' scales
        return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)

    optimizer = optax.chain(
        optax.clip_by_global_norm(common.GPT_CLIP),
        optax.adamw(common.LEARNING_RATE, b1=common.BETA_1, b2=common.GPT_BETA_2,
                    weight_decay=common.GPT_WEIGHT_DECAY, mask=matrices))
    opt_state = optimizer.init(params)
    tokens, targets = common.synthetic_tokens(batch, block)
    x, y = jnp.asarray(tokens.astype(np.int32)), jnp.asarray(targets.astype(np.int32))
    mixed = args.precision == "mixed_bfloat16"

    def loss_fn(params, x, y):
        if mixed:  # the matrices in bfloat16; layer norms and softmax compute in float32
            params = jax.tree_util.tree_map(
                lambda p: p.astype(jnp.bfloat16) if p.ndim >= 2 else p, params)
        logits = forward_gpt(params, x, heads).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    state = [params, opt_state]

    def step():
        state[0], state[1], loss = step_fn(state[0], state[1], x, y)
        jax.block_until_ready(state)  # the update too, not only the loss
        return float(loss)

    return common.median_step_seconds(step, args.warmup, args.steps)


def time_config(name, args):
    kind, _, batch = common.CONFIGS[name]
    if kind == "resnet":
        return time_resnet(name, args)
    if kind in common.GPT_SHAPES:
        return time_gpt(name, args)
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
    args = common.parse_args(__doc__.splitlines()[0], gpt=True)
    report = common.Report(
        f"JAX {jax.__version__} (optax {optax.__version__}) on the CPU, {args.precision}, Adam "
        "(GPT: AdamW with clipping); the whole step in one jax.jit", args)
    for name in args.configs:
        report.row(name, time_config(name, args), f"devices={jax.device_count()}")
    if not args.csv:
        print("\nreproduce: build/bench-peers-venv/bin/python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
