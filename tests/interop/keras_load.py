"""Loads a Tandem checkpoint of the sample MLP into Keras and checks its Fashion-MNIST test
accuracy against the accuracy Tandem reported for the same weights.

usage: keras_load.py CHECKPOINT TANDEM_ACCURACY [--data-dir DIR] [--tolerance T]
  Builds Keras' Sequential([Input((28, 28)), Flatten(), Dense(256, relu), Dense(128, relu),
  Dense(10)]), calls model.load_weights(CHECKPOINT) (the legacy-h5 loader descends into
  /model_weights), evaluates the 10000 test images (t10k-*-ubyte.gz, pixels / 255) and compares.
  When the checkpoint's directory has a `checkpoint` state file, TensorFlow parses it too.
Exit status: 0 equal within the tolerance (default 0.001), 1 not, 77 TensorFlow is missing.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:
    import numpy as np
    import tensorflow as tf
    from tensorflow import keras
except ImportError as e:  # CI without TensorFlow: the C++ test reports a skip
    print(f"skip: {e}")
    sys.exit(77)
from interop_common import read_idx  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("tandem_accuracy", type=float)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--tolerance", type=float, default=0.001)
    args = parser.parse_args()

    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.load_weights(args.checkpoint)

    images = read_idx(os.path.join(args.data_dir, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data_dir, "t10k-labels-idx1-ubyte.gz"))
    x = images.astype(np.float32) / np.float32(255.0)  # as Tandem's IDX reader: exact v / 255
    logits = model.predict(x, batch_size=1000, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))

    state_dir = os.path.dirname(os.path.abspath(args.checkpoint))
    if os.path.exists(os.path.join(state_dir, "checkpoint")):
        state = tf.train.get_checkpoint_state(state_dir)
        print(f"TensorFlow parses the state file: model_checkpoint_path="
              f"{state.model_checkpoint_path}, all={list(state.all_model_checkpoint_paths)}")

    difference = abs(accuracy - args.tandem_accuracy)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: load_weights({args.checkpoint})")
    print(f"Keras test accuracy {accuracy:.4f}, Tandem {args.tandem_accuracy:.4f}, "
          f"difference {difference:.4f} (tolerance {args.tolerance})")
    return 0 if difference <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
