"""BatchNormalization in Keras 3, for the parity test of Tandem's: plain on one replica, and
synchronized under MirroredStrategy over two logical CPU devices.

usage: keras_batch_norm.py OUT_DIR [--steps N]
  Makes Sequential([Input((6,)), Dense(8, use_bias=False), BatchNormalization(), Dense(4)]),
  writes its initial weights to OUT_DIR/initial.weights.h5 and the data to OUT_DIR/x.f32
  (N x 32 rows of 6 float32) and OUT_DIR/y.i64 (labels 0..3), then trains it N steps (default
  20) on 32-row batches in order with SGD(0.1) and the mean SparseCategoricalCrossentropy
  (from_logits=True): OUT_DIR/plain.weights.h5. Then the same from the same initial weights
  with BatchNormalization(synchronized=True) under MirroredStrategy on two CPU devices, each
  replica taking 16 rows, the loss divided by the global batch (compute_average_loss):
  OUT_DIR/synchronized.weights.h5. Also writes the first step's training-mode outputs
  (OUT_DIR/plain_first.f32) and the outputs in inference mode after training
  (OUT_DIR/plain_inference.f32). Last, what Keras 3 makes of an unsynchronized
  BatchNormalization(momentum=0.5) under that strategy after one step in which replica r sees
  rows (r + 1) x 10 x [1, 2] and (r + 1) x 10 x [1, 2] + 1: OUT_DIR/unsynchronized.f32 holds
  replica 0's and replica 1's copies of moving_mean, then what a cross-replica read (and so
  save_weights) gives. And a small convolutional model, Sequential([Input((8, 8, 2)),
  Conv2D(4, 3, padding="same", use_bias=False), BatchNormalization(), Activation("relu"),
  AveragePooling2D(3, strides=2, padding="same"), GlobalAveragePooling2D(),
  LayerNormalization(), Dense(3)]): OUT_DIR/cnn_initial.weights.h5,
  the images OUT_DIR/cnn_x.f32 (10 x 16 of 8x8x2), labels OUT_DIR/cnn_y.i64, and after 10 SGD(0.1)
  steps of 16 images OUT_DIR/cnn_final.weights.h5. And Sequential([Input((5,), int32),
  Embedding(50, 4), Flatten(), Dense(3)]): OUT_DIR/embed_initial.weights.h5, the token ids
  OUT_DIR/embed_x.i32 (80 x 5; token 9 first in every sequence), and after 10 SGD(0.1) steps of
  8 sequences (labels: the CNN's) OUT_DIR/embed_final.weights.h5.
Exit status: 0 written, 1 failed, 77 TensorFlow or Keras 3 is missing.
"""
import argparse
import os
import sys

from interop_common import require_keras3

np, tf, keras = require_keras3()

BATCH = 32


def make_model(synchronized):
    return keras.Sequential([
        keras.Input(shape=(6,)),
        keras.layers.Dense(8, use_bias=False),
        keras.layers.BatchNormalization(synchronized=synchronized),
        keras.layers.Dense(4),
    ])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    # Two logical CPU devices for MirroredStrategy (before TensorFlow initialises them).
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    rng = np.random.default_rng(5)
    n = args.steps * BATCH
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = ((np.arange(n) * 5 + 1) % 4).astype(np.int64)
    x.tofile(os.path.join(args.out_dir, "x.f32"))
    y.tofile(os.path.join(args.out_dir, "y.i64"))

    keras.utils.set_random_seed(11)
    model = make_model(False)
    initial = os.path.join(args.out_dir, "initial.weights.h5")
    model.save_weights(initial)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(0.1)
    for s in range(args.steps):
        xb, yb = x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits)
        if s == 0:
            logits.numpy().astype(np.float32).tofile(os.path.join(args.out_dir, "plain_first.f32"))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    model.save_weights(os.path.join(args.out_dir, "plain.weights.h5"))
    model(x[:BATCH], training=False).numpy().astype(np.float32).tofile(
        os.path.join(args.out_dir, "plain_inference.f32"))

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        synced = make_model(True)
        synced.load_weights(initial)
        sgd = keras.optimizers.SGD(0.1)
    per_replica_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")

    @tf.function
    def step(xb, yb):
        def replica_step(xr, yr):
            with tf.GradientTape() as tape:
                logits = synced(xr, training=True)
                loss = tf.nn.compute_average_loss(per_replica_loss(yr, logits),
                                                  global_batch_size=BATCH)
            grads = tape.gradient(loss, synced.trainable_variables)
            sgd.apply_gradients(zip(grads, synced.trainable_variables))
            return loss
        return strategy.run(replica_step, args=(xb, yb))

    for s in range(args.steps):
        xb, yb = x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]
        # Replica 0 takes the first 16 rows, replica 1 the next 16.
        def rows(values):
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: values[ctx.replica_id_in_sync_group * 16:
                                   (ctx.replica_id_in_sync_group + 1) * 16])
        step(rows(xb), rows(yb))
    synced.save_weights(os.path.join(args.out_dir, "synchronized.weights.h5"))

    with strategy.scope():
        bn = keras.layers.BatchNormalization(momentum=0.5)
        bn.build((None, 2))

    @tf.function
    def bn_step(xr):
        return strategy.run(lambda v: bn(v, training=True), args=(xr,))

    bn_step(strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([[1.0, 2.0]]) * float((ctx.replica_id_in_sync_group + 1) * 10) +
        tf.constant([[0.0], [1.0]])))
    copies = [c.numpy() for c in strategy.experimental_local_results(bn.moving_mean.value)]
    np.concatenate(copies + [bn.moving_mean.numpy()]).astype(np.float32).tofile(
        os.path.join(args.out_dir, "unsynchronized.f32"))

    keras.utils.set_random_seed(13)
    cnn = keras.Sequential([
        keras.Input(shape=(8, 8, 2)),
        keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"),
        keras.layers.AveragePooling2D(3, strides=2, padding="same"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.LayerNormalization(),
        keras.layers.Dense(3),
    ])
    cnn.save_weights(os.path.join(args.out_dir, "cnn_initial.weights.h5"))
    images = rng.standard_normal((160, 8, 8, 2)).astype(np.float32)
    classes = (np.arange(160) % 3).astype(np.int64)
    images.tofile(os.path.join(args.out_dir, "cnn_x.f32"))
    classes.tofile(os.path.join(args.out_dir, "cnn_y.i64"))
    cnn_sgd = keras.optimizers.SGD(0.1)
    for s in range(10):
        with tf.GradientTape() as tape:
            loss = loss_fn(classes[s * 16:(s + 1) * 16], cnn(images[s * 16:(s + 1) * 16], training=True))
        grads = tape.gradient(loss, cnn.trainable_variables)
        cnn_sgd.apply_gradients(zip(grads, cnn.trainable_variables))
    cnn.save_weights(os.path.join(args.out_dir, "cnn_final.weights.h5"))

    keras.utils.set_random_seed(17)
    embed = keras.Sequential([
        keras.Input(shape=(5,), dtype="int32"),
        keras.layers.Embedding(50, 4),
        keras.layers.Flatten(),
        keras.layers.Dense(3),
    ])
    embed.save_weights(os.path.join(args.out_dir, "embed_initial.weights.h5"))
    tokens = ((np.arange(80 * 5) * 7 + 3) % 50).astype(np.int32).reshape(80, 5)
    tokens[:, 0] = 9  # a row every example shares: its gradient adds 8 rows per step
    tokens.tofile(os.path.join(args.out_dir, "embed_x.i32"))
    embed_sgd = keras.optimizers.SGD(0.1)
    for s in range(10):
        with tf.GradientTape() as tape:
            loss = loss_fn(classes[s * 8:(s + 1) * 8], embed(tokens[s * 8:(s + 1) * 8], training=True))
        grads = tape.gradient(loss, embed.trainable_variables)
        embed_sgd.apply_gradients(zip(grads, embed.trainable_variables))
    embed.save_weights(os.path.join(args.out_dir, "embed_final.weights.h5"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
