# Python modules: keras, h5py, numpy (a Python with TensorFlow and Keras 3; exits 77 without them)
"""A model with residual blocks written as a Keras layer of layers, for the interop test of
Tandem's blocks (tests/checkpoint/test_keras_blocks.cpp) in both directions.

usage: keras_blocks.py OUT_DIR                  Keras writes
       keras_blocks.py OUT_DIR --load FILE      Keras reads what Tandem wrote

  The model: Sequential([Input((8, 8, 2)), Conv2D(4, 3, same, no bias), BatchNormalization(),
  Activation("relu"), ResidualBlock(4), ResidualBlock(8, stride=2), GlobalAveragePooling2D(),
  Dense(3)]); ResidualBlock is the ResNet basic block of samples/fashion_mnist_resnet (attributes
  conv1, bn1, conv2, bn2 and, when it changes the shape, shortcut = Sequential([Conv2D 1x1,
  BatchNormalization()])).

  Writing: the initial weights as OUT_DIR/initial.weights.h5 (Keras 3) and
  OUT_DIR/initial_legacy.h5 (Keras's legacy h5 weights writer), the images OUT_DIR/x.f32 (80 of
  8x8x2) and labels OUT_DIR/y.i64, then 10 steps of SGD(0.1, momentum 0.9) on 8 images each and
  the mean SparseCategoricalCrossentropy (from_logits=True): OUT_DIR/final.weights.h5 and the
  inference-mode logits of all 80 images, OUT_DIR/final_logits.f32.
  Reading: model.load_weights(FILE) (a Tandem checkpoint: Keras's legacy h5 model layout), then
  the inference-mode logits of the 80 images to OUT_DIR/loaded_logits.f32.
Exit status: 0 done, 1 failed, 77 TensorFlow or Keras 3 is missing.
"""
import argparse
import os
import sys

from interop_common import require_keras3

np, tf, keras = require_keras3()


class ResidualBlock(keras.layers.Layer):
    def __init__(self, filters, stride=1, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.stride = filters, stride

        def conv(size, s):
            return keras.layers.Conv2D(filters, size, strides=s, padding="same", use_bias=False)

        self.conv1 = conv(3, stride)
        self.bn1 = keras.layers.BatchNormalization()
        self.conv2 = conv(3, 1)
        self.bn2 = keras.layers.BatchNormalization()
        self.shortcut = None
        if stride != 1:
            self.shortcut = keras.Sequential([conv(1, stride), keras.layers.BatchNormalization()])

    def build(self, input_shape):
        self.conv1.build(input_shape)
        shape = self.conv1.compute_output_shape(input_shape)
        self.bn1.build(shape)
        self.conv2.build(shape)
        self.bn2.build(shape)
        if self.shortcut is not None:
            self.shortcut.build(input_shape)

    def call(self, x, training=False):
        y = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        y = self.bn2(self.conv2(y), training=training)
        skip = self.shortcut(x, training=training) if self.shortcut is not None else x
        return keras.ops.relu(keras.layers.add([y, skip]))

    def compute_output_shape(self, input_shape):
        return self.conv1.compute_output_shape(input_shape)[:-1] + (self.filters,)


def make_model():
    return keras.Sequential([
        keras.Input(shape=(8, 8, 2)),
        keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"),
        ResidualBlock(4),
        ResidualBlock(8, stride=2),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--load")
    args = parser.parse_args()
    out = lambda name: os.path.join(args.out_dir, name)  # noqa: E731
    keras.utils.set_random_seed(19)
    model = make_model()

    if args.load:
        model.load_weights(args.load)
        images = np.fromfile(out("x.f32"), dtype=np.float32).reshape(80, 8, 8, 2)
        model(images, training=False).numpy().astype(np.float32).tofile(out("loaded_logits.f32"))
        return 0

    import h5py
    from keras.src.legacy.saving import legacy_h5_format
    os.makedirs(args.out_dir, exist_ok=True)
    model.save_weights(out("initial.weights.h5"))
    with h5py.File(out("initial_legacy.h5"), "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)
    rng = np.random.default_rng(23)
    images = rng.standard_normal((80, 8, 8, 2)).astype(np.float32)
    labels = (np.arange(80) * 7 % 3).astype(np.int64)
    images.tofile(out("x.f32"))
    labels.tofile(out("y.i64"))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    for s in range(10):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[s * 8:(s + 1) * 8], model(images[s * 8:(s + 1) * 8], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        sgd.apply_gradients(zip(grads, model.trainable_variables))
    model.save_weights(out("final.weights.h5"))
    model(images, training=False).numpy().astype(np.float32).tofile(out("final_logits.f32"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
