"""Opens a Tandem checkpoint of the sample MLP (Flatten, Dense(256), Dense(128), Dense(10)) with
h5py and checks the Keras layout and the values against raw float32 dumps written by Tandem.

usage: check_h5py.py CHECKPOINT EXPECTED_DIR
  EXPECTED_DIR holds <variable with '/' as '__'>.f32 (raw little-endian float32, Tandem's values).
Exit status: 0 ok, 1 a check failed, 77 h5py or numpy is missing (the test is skipped).
"""
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the C++ test reports a skip
    print(f"skip: {e}")
    sys.exit(77)


def text(value):
    """A string attribute as str: Tandem writes fixed-length strings, which h5py reads as bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def strings(values):
    return [text(v) for v in values]


def variable_length_attributes(f):
    """Every attribute whose strings are variable-length (kept in a global heap): none."""
    found = []

    def visit(name, obj):
        for key in obj.attrs:
            info = h5py.check_string_dtype(obj.attrs.get_id(key).dtype)
            if info is not None and info.length is None:
                found.append(f"{name}@{key}")

    visit("/", f)
    f.visititems(visit)
    return found


def main(path, expected_dir):
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    with h5py.File(path, "r") as f:
        check(text(f.attrs["tandem_format"]) == "tandem.checkpoint", "tandem_format")
        vlen = variable_length_attributes(f)
        check(not vlen, f"variable-length string attributes {vlen}")
        check(int(f.attrs["tandem_format_version"]) == 1, "tandem_format_version")
        check("layer_names" not in f.attrs, "the root must not carry layer_names")
        weights = f["model_weights"]
        layer_names = strings(weights.attrs["layer_names"])
        check(layer_names == ["flatten", "dense", "dense_1", "dense_2"], f"layer_names {layer_names}")
        check(text(weights.attrs["backend"]) == "tensorflow", "backend")
        check(text(weights.attrs["keras_version"]) == "2.15.0", "keras_version")
        check(strings(weights["flatten"].attrs["weight_names"]) == [], "flatten has no weights")
        shapes = {"dense": (784, 256), "dense_1": (256, 128), "dense_2": (128, 10)}
        for layer, (n_in, n_out) in shapes.items():
            names = strings(weights[layer].attrs["weight_names"])
            check(names == [f"{layer}/kernel:0", f"{layer}/bias:0"], f"{layer} weight_names {names}")
            for name, shape in ((f"{layer}/kernel:0", (n_in, n_out)), (f"{layer}/bias:0", (n_out,))):
                data = weights[layer][name]
                check(data.dtype == np.dtype("<f4"), f"{name} dtype {data.dtype}")
                check(data.shape == shape, f"{name} shape {data.shape}")
                check(data.compression is None and data.fletcher32,
                      f"{name} uncompressed, with a Fletcher-32 checksum")
                dump = os.path.join(expected_dir, name[:-2].replace("/", "__") + ".f32")
                expected = np.fromfile(dump, dtype="<f4").reshape(shape)
                check(np.array_equal(data[()], expected), f"{name} values differ from Tandem's")
        optimizer = f["optimizer_weights"]
        check(optimizer["iteration:0"].dtype == np.int64 and optimizer["iteration:0"].shape == (),
              "iteration:0 int64 scalar")
        check("m/dense/kernel:0" in strings(optimizer.attrs["weight_names"]), "adam slot names")
        rng = f["training_state/rng/replica_state"]
        check(rng.dtype == np.uint64 and rng.shape[1] == 4, "rng/replica_state uint64 [R, 4]")
        check(text(rng.attrs["algorithm"]) == "philox4x32-10", "rng algorithm")
    for failure in failures:
        print("FAILED:", failure)
    if not failures:
        print(f"ok: {path}: layer_names {layer_names}; kernels float32 and equal to Tandem's")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
