#!/usr/bin/env python3
# Python modules: tensorflow, keras (bench/peers/run's venv) and common (beside this script)
"""TensorFlow (tensorflow-cpu, Keras 3) on bench_step_cpu's configurations: a custom training
loop, strategy.run(step) inside one tf.function under OneDeviceStrategy("/cpu:0"), Keras
layers, SparseCategoricalCrossentropy, tf.nn.compute_average_loss, keras Adam; float32, or
with --precision mixed_bfloat16 Keras's mixed_bfloat16 policy. Each configuration is timed with
tf.function as it is and with jit_compile=True (XLA), and the faster is reported.
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


def time_config(name, args, jit):
    kind, _, batch = common.CONFIGS[name]
    keras.utils.set_random_seed(42)
    keras.mixed_precision.set_global_policy(args.precision)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    images, labels = common.synthetic_batch(batch)
    if kind in ("cnn", "resnet"):
        images = images.reshape(batch, 28, 28, 1)  # NHWC, as the Tandem sample
    with strategy.scope():
        model = build_model(kind)
        optimizer = keras.optimizers.Adam(learning_rate=common.LEARNING_RATE,
                                          beta_1=common.BETA_1, beta_2=common.BETA_2,
                                          epsilon=common.EPSILON)
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    x = tf.constant(images)
    y = tf.constant(labels)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function(jit_compile=jit)
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    return common.median_step_seconds(lambda: float(train_step(x, y)), args.warmup, args.steps)


def main():
    args = common.parse_args(__doc__.splitlines()[0])
    report = common.Report(
        f"TensorFlow {tf.__version__} (Keras {keras.__version__}) on the CPU, {args.precision}, "
        "Adam; strategy.run in tf.function (the better of jit_compile off and on), "
        "OneDeviceStrategy", args)
    threads = tf.config.threading.get_intra_op_parallelism_threads() or "auto"
    for name in args.configs:
        seconds, jit = min((time_config(name, args, jit), jit) for jit in (False, True))
        report.row(name, seconds, f"intra_op={threads} jit_compile={jit}")
    if not args.csv:
        print("\nreproduce: build/bench-peers-venv/bin/python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
