#!/usr/bin/env python3
# Python modules: keras, numpy (a Python with TensorFlow and Keras 3; exits 77 without them)
"""Keras 3's LossScaleOptimizer around SGD(learning_rate=1) on a variable [1, 2], fed the gradients
of a scaled loss: for each value g of GRADIENTS (comma-separated; inf and nan allowed), the
gradient (g, 0.125) x the current scale. Prints, after each update, one line:
"scale step_counter iterations w0 w1" (floats in repr, exact).

    python keras_loss_scale.py GRADIENTS INITIAL_SCALE DYNAMIC_GROWTH_STEPS
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
try:
    import keras
    import numpy as np
except ImportError:
    sys.exit(77)


def main():
    values = [float(v) for v in sys.argv[1].split(",")]
    initial, growth = float(sys.argv[2]), int(sys.argv[3])
    w = keras.Variable(np.array([1.0, 2.0], dtype="float32"), name="w")
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(learning_rate=1.0), initial_scale=initial,
        dynamic_growth_steps=growth)
    optimizer.build([w])
    for g in values:
        scale = np.float32(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
        gradient = np.array([np.float32(g) * scale, np.float32(0.125) * scale], dtype="float32")
        optimizer.apply([gradient], [w])
        weights = keras.ops.convert_to_numpy(w)
        print(repr(float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))),
              int(keras.ops.convert_to_numpy(optimizer.step_counter)),
              int(keras.ops.convert_to_numpy(optimizer.iterations)),
              repr(float(weights[0])), repr(float(weights[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
