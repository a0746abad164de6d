#!/usr/bin/env python3
# Python modules: tensorflow, keras (bench/peers/run's venv) and common (beside this script)
"""TensorFlow (tensorflow-cpu, Keras 3) on bench_step_cpu's configurations: a custom training
loop, strategy.run(step) inside one tf.function under OneDeviceStrategy("/cpu:0"), Keras
layers, SparseCategoricalCrossentropy, tf.nn.compute_average_loss, keras Adam (the GPTs: keras
AdamW with global-norm clipping, keras.layers.MultiHeadAttention with its causal mask); float32,
or with --precision mixed_bfloat16 Keras's mixed_bfloat16 policy. Each configuration is timed
with tf.function as it is and with jit_compile=True (XLA), and the faster is reported.
TensorFlow's default thread pools (all cores).

    build/bench-peers-venv/bin/python bench/peers/tf_step.py [--configs mlp-b64,...] [--csv]
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no start-up banners on stderr

import common  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402


def build_resnet():
    def conv(filters, size, stride):
        return keras.layers.Conv2D(filters, size, strides=stride, padding="same", use_bias=False)

    def norm():
        return keras.layers.BatchNormalization(momentum=common.BN_MOMENTUM,
                                               epsilon=common.BN_EPSILON)

    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Activation("relu")(norm()(conv(16, 3, 1)(inputs)))
    for filters, stride in common.RESNET_BLOCKS:
        y = keras.layers.Activation("relu")(norm()(conv(filters, 3, stride)(x)))
        y = norm()(conv(filters, 3, 1)(y))
        shortcut = norm()(conv(filters, 1, stride)(x)) if stride != 1 else x
        x = keras.layers.Activation("relu")(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def build_model(kind):
    glorot = "glorot_uniform"  # Keras' default, spelled out: the same as Tandem's
    if kind == "resnet":
        return build_resnet()
    if kind == "cnn":
        # fashion_mnist_cnn's model (TensorFlow's tutorial convnet): 5x5 'same' convolutions.
        conv = dict(padding="same", activation="relu", kernel_initializer=glorot)
        layers = [keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 5, **conv),
                  keras.layers.MaxPooling2D(2), keras.layers.Conv2D(64, 5, **conv),
                  keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                  keras.layers.Dense(1024, activation="relu", kernel_initializer=glorot),
                  keras.layers.Dropout(0.4), keras.layers.Dense(10, kernel_initializer=glorot)]
    else:
        layers = [keras.Input((28, 28)), keras.layers.Flatten()]
        layers += [keras.layers.Dense(w, activation="relu", kernel_initializer=glorot)
                   for w in common.HIDDEN[kind]]
        layers.append(keras.layers.Dense(10, kernel_initializer=glorot))
    return keras.Sequential(layers)


class TiedLogits(keras.layers.Layer):
    """The output layer tied to the token embedding: logits = x @ embeddings^T (in x's dtype, so
    bfloat16 under the mixed policy)."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return tf.matmul(x, tf.cast(self.embedding.embeddings, x.dtype), transpose_b=True)


class GptBlock(keras.layers.Layer):
    """Pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x)); no biases."""

    def __init__(self, heads, embed, projection_std, **kwargs):
        super().__init__(**kwargs)
        normal = keras.initializers.RandomNormal
        self.ln_1 = keras.layers.LayerNormalization(epsilon=1e-5, center=False)
        self.attention = keras.layers.MultiHeadAttention(
            heads, key_dim=embed // heads, use_bias=False, kernel_initializer=normal(stddev=0.02))
        self.ln_2 = keras.layers.LayerNormalization(epsilon=1e-5, center=False)
        self.fc = keras.layers.Dense(4 * embed, use_bias=False,
                                     kernel_initializer=normal(stddev=0.02))
        self.out = keras.layers.Dense(embed, use_bias=False,
                                      kernel_initializer=normal(stddev=projection_std))

    def call(self, x):
        h = self.ln_1(x)
        x = x + self.attention(h, h, use_causal_mask=True)
        return x + self.out(keras.activations.gelu(self.fc(self.ln_2(x)), approximate=False))


class Gpt(keras.Model):
    """nanoGPT's model (bias=False), as torch_step's build_gpt: token + learned position
    embeddings, pre-norm blocks, a final layer norm, logits through the token embedding."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        layers, heads, embed, block = common.GPT_SHAPES[kind]
        normal = keras.initializers.RandomNormal(stddev=0.02)
        self.projection_std = 0.02 / (2 * layers) ** 0.5  # the residual branches' last layers
        self.tokens = keras.layers.Embedding(common.GPT_VOCABULARY, embed,
                                             embeddings_initializer=normal)
        self.positions = keras.layers.Embedding(block, embed, embeddings_initializer=normal)
        self.blocks = [GptBlock(heads, embed, self.projection_std) for _ in range(layers)]
        self.ln_f = keras.layers.LayerNormalization(epsilon=1e-5, center=False)
        self.head = TiedLogits(self.tokens)

    def call(self, ids):
        x = self.tokens(ids) + self.positions(tf.range(tf.shape(ids)[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_gpt(kind, ids):
    """Gpt(kind), built on `ids`; MultiHeadAttention gives all four of its projections one
    initializer, so its output projection is drawn again with the residual branches' std."""
    model = Gpt(kind)
    model(ids)
    for block in model.blocks:
        kernel = block.attention.output_dense.kernel
        kernel.assign(keras.initializers.RandomNormal(stddev=model.projection_std)(kernel.shape))
    return model


def gpt_optimizer(model):
    """AdamW, weight decay on the matrices only (not on the layer norms' scales), clipping at
    global norm GPT_CLIP; Keras's default epsilon."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=common.LEARNING_RATE, weight_decay=common.GPT_WEIGHT_DECAY,
        beta_1=common.BETA_1, beta_2=common.GPT_BETA_2, global_clipnorm=common.GPT_CLIP)
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    return optimizer


def time_config(name, args, jit):
    kind, _, batch = common.CONFIGS[name]
    gpt = kind in common.GPT_SHAPES
    keras.utils.set_random_seed(42)
    keras.mixed_precision.set_global_policy(args.precision)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    if gpt:
        inputs, labels = common.synthetic_tokens(batch, common.GPT_SHAPES[kind][3])
    else:
        inputs, labels = common.synthetic_batch(batch)
        if kind in ("cnn", "resnet"):
            inputs = inputs.reshape(batch, 28, 28, 1)  # NHWC, as the Tandem sample
    x = tf.constant(inputs)
    y = tf.constant(labels)
    with strategy.scope():
        if gpt:
            model = build_gpt(kind, x)
            optimizer = gpt_optimizer(model)
        else:
            model = build_model(kind)
            optimizer = keras.optimizers.Adam(learning_rate=common.LEARNING_RATE,
                                              beta_1=common.BETA_1, beta_2=common.BETA_2,
                                              epsilon=common.EPSILON)
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            if gpt:  # per token, [batch, block], in float32: a sequence's loss is their mean
                per_sample = tf.reduce_mean(loss_fn(y, tf.cast(logits, tf.float32)), axis=1)
            else:
                per_sample = loss_fn(y, logits)
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function(jit_compile=jit)
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    return common.median_step_seconds(lambda: float(train_step(x, y)), args.warmup, args.steps)


def main():
    args = common.parse_args(__doc__.splitlines()[0], gpt=True)
    report = common.Report(
        f"TensorFlow {tf.__version__} (Keras {keras.__version__}) on the CPU, {args.precision}, "
        "Adam (GPT: AdamW with clipping); strategy.run in tf.function (the better of "
        "jit_compile off and on), OneDeviceStrategy", args)
    threads = tf.config.threading.get_intra_op_parallelism_threads() or "auto"
    for name in args.configs:
        seconds, jit = min((time_config(name, args, jit), jit) for jit in (False, True))
        report.row(name, seconds, f"intra_op={threads} jit_compile={jit}")
    if not args.csv:
        print("\nreproduce: build/bench-peers-venv/bin/python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
