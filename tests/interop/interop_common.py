"""What the Keras interop scripts share: importing TensorFlow and Keras 3 or exiting 77 (the
C++ tests then report a skip), and reading Fashion-MNIST's IDX files as Tandem's reader does.
"""
import gzip
import os
import sys


def require_keras3():
    """(numpy, tensorflow, keras) with Keras 3, or exit 77 saying what is missing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import numpy
        import tensorflow
        import keras
    except ImportError as e:  # CI without TensorFlow: the C++ test reports a skip
        print(f"skip: {e}")
        sys.exit(77)
    if not keras.__version__.startswith("3."):
        print(f"skip: Keras {keras.__version__} is not Keras 3")
        sys.exit(77)
    return numpy, tensorflow, keras


def read_idx(path):
    """An IDX file (gzip) as a uint8 numpy array of its shape."""
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
