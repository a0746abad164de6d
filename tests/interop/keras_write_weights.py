"""Trains the sample MLP briefly in Keras and writes its weights in every layout Keras writes, with
Keras's logits on the first 1000 Fashion-MNIST test images, for Tandem's load_weights to read.

usage: keras_write_weights.py OUT_DIR [--data-dir DIR] [--steps N]
  Builds Keras' Sequential([Input((28, 28)), Flatten(), Dense(256, relu), Dense(128, relu),
  Dense(10)]), trains it for N steps (default 200) of 128 training images (pixels / 255) with
  Adam, then writes into OUT_DIR:
    keras3.weights.h5     model.save_weights("x.weights.h5")             (Keras 3 layout)
    legacy_weights.h5     Keras 3's legacy h5 weights writer              (root layer_names)
    legacy_model.h5       model.save("x.h5")                              (/model_weights)
    tf_keras_weights.h5   tf-keras model.save_weights("x.h5")   only when tf_keras is installed
    tf_keras_model.h5     tf-keras model.save("x.h5")           only when tf_keras is installed
    logits.f32            Keras's logits on test images 0..999: float32 little-endian [1000, 10]
    files.txt             the weight files written, one name a line
  (Keras 3 refuses model.save_weights("x.h5"); the legacy weights file comes from the writer its
  legacy loader pairs with, keras.src.legacy.saving.legacy_h5_format.)
Exit status: 0 written, 1 failed, 77 TensorFlow or Keras 3 is missing.
"""
import argparse
import os
import sys

from interop_common import require_keras3, read_idx

np, tf, keras = require_keras3()
try:
    import h5py
    from keras.src.legacy.saving import legacy_h5_format
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)


def sample_mlp(k):
    """The sample MLP in the Keras API `k` (keras or tf_keras)."""
    return k.Sequential([
        k.Input(shape=(28, 28)),
        k.layers.Flatten(),
        k.layers.Dense(256, activation="relu"),
        k.layers.Dense(128, activation="relu"),
        k.layers.Dense(10),
    ])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    def images(name):  # as Tandem's IDX reader: exact v / 255 in float32
        return read_idx(os.path.join(args.data_dir, name)).astype(np.float32) / np.float32(255.0)

    train_x = images("train-images-idx3-ubyte.gz")[: args.steps * 128]
    train_y = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))[: len(train_x)]
    test_x = images("t10k-images-idx3-ubyte.gz")[:1000]

    keras.utils.set_random_seed(7)
    model = sample_mlp(keras)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(train_x, train_y, batch_size=128, epochs=1, shuffle=True, verbose=0)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: trained {args.steps} steps, "
          f"loss {history.history['loss'][-1]:.4f}, accuracy {history.history['accuracy'][-1]:.4f}")

    logits = model.predict(test_x, batch_size=1000, verbose=0).astype("<f4")
    with open(os.path.join(args.out_dir, "logits.f32"), "wb") as f:
        f.write(logits.tobytes())

    written = []

    def out(name):
        written.append(name)
        return os.path.join(args.out_dir, name)

    model.save_weights(out("keras3.weights.h5"))
    with h5py.File(out("legacy_weights.h5"), "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)
    model.save(out("legacy_model.h5"))  # Keras 3 writes a .h5 model in the legacy format

    try:
        import tf_keras
    except ImportError:
        print("tf_keras is not installed: no tf-keras (Keras 2) files")
    else:
        legacy = sample_mlp(tf_keras)
        legacy.set_weights(model.get_weights())
        legacy.compile(optimizer="adam", loss="mse")
        legacy.save_weights(out("tf_keras_weights.h5"))
        legacy.save(out("tf_keras_model.h5"))
        difference = np.max(np.abs(legacy.predict(test_x, verbose=0) - logits))
        print(f"tf_keras {tf_keras.__version__}: logits differ from Keras 3's by {difference:g}")

    with open(os.path.join(args.out_dir, "files.txt"), "w") as f:
        f.write("".join(name + "\n" for name in written))
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
