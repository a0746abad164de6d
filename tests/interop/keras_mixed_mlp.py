"""The sample MLP in Keras 3 under the mixed_bfloat16 policy, trained by a custom loop, for the
parity test of Tandem's mixed precision.

usage: keras_mixed_mlp.py OUT_DIR [--data-dir DIR] [--steps N] [--batch B]
  Builds Sequential([Input((28, 28)), Flatten(), Dense(256, relu), Dense(128, relu), Dense(10)])
  under keras.mixed_precision.set_global_policy("mixed_bfloat16"), writes its initial weights to
  OUT_DIR/initial.weights.h5 (model.save_weights), then trains N steps (default 100) on the first
  N x B training images in order (pixels / 255; B default 64): GradientTape, the mean
  SparseCategoricalCrossentropy(from_logits=True), Adam(1e-3) on the float32 variables. Writes
  OUT_DIR/losses.f32: the N step losses, float32 little-endian.
Exit status: 0 written, 1 failed, 77 TensorFlow or Keras 3 is missing.
"""
import argparse
import os
import sys

from interop_common import require_keras3, read_idx

np, tf, keras = require_keras3()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    n = args.steps * args.batch
    x = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"))[:n]
    x = x.astype(np.float32) / np.float32(255.0)  # as Tandem's IDX reader: exact v / 255
    y = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))[:n].astype(np.int64)

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(11)
    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.save_weights(os.path.join(args.out_dir, "initial.weights.h5"))
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = []
    for s in range(args.steps):
        lo, hi = s * args.batch, (s + 1) * args.batch
        losses.append(float(step(tf.constant(x[lo:hi]), tf.constant(y[lo:hi]))))
    np.asarray(losses, dtype="<f4").tofile(os.path.join(args.out_dir, "losses.f32"))
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: {args.steps} steps under "
          f"mixed_bfloat16, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
