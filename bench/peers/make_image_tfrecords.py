#!/usr/bin/env python3
# Python modules: tensorflow (tensorflow-cpu==2.21.0, the venv of bench/peers/run), numpy
"""Writes the Fashion-MNIST training images as TFRecord files of tf.train.Examples
{image: PNG or JPEG bytes, label: int64}, encoded by TensorFlow: the input of
bench/image_pipeline.sh.

    make_image_tfrecords.py OUT_DIR [--format png|jpeg] [--files 8]
        [--source /usr/share/datasets/fashion-mnist]"""
import argparse
import gzip
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def find(source, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(source, name)):
            return os.path.join(source, name)
    raise SystemExit(f"make_image_tfrecords: no {stem}[.gz] in {source}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--format", choices=["png", "jpeg"], default="png")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    images = read_idx(find(args.source, "train-images-idx3-ubyte"))
    labels = read_idx(find(args.source, "train-labels-idx1-ubyte"))
    os.makedirs(args.out_dir, exist_ok=True)
    encode = tf.io.encode_png if args.format == "png" else tf.io.encode_jpeg
    per_file = (len(images) + args.files - 1) // args.files
    for f in range(args.files):
        path = os.path.join(args.out_dir, f"train-{f:02d}-of-{args.files:02d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(f * per_file, min(len(images), (f + 1) * per_file)):
                encoded = encode(images[i][:, :, None]).numpy()
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
                }))
                writer.write(example.SerializeToString())
    print(f"wrote {len(images)} {args.format} examples in {args.files} files to {args.out_dir}")


if __name__ == "__main__":
    main()
