#!/usr/bin/env python3
# Python modules: tensorflow (tensorflow-cpu==2.21.0, the venv of bench/peers/run)
"""The tf.data side of bench/image_pipeline.sh: the pipeline of bench_image_pipeline (parse,
decode, random 24x24 crop resized back to 28x28, random flip, normalization, batch, prefetch)
over the same TFRecord files, with map(num_parallel_calls=AUTOTUNE) on `--threads` cores.

    tf_image_pipeline.py --files 'DIR/*.tfrecord' [--epochs 3] [--batch 256] [--threads 2]

Prints one line per epoch ("epoch E: S s, N examples, X examples/s, mean pixel M") and the
median."""
import argparse
import glob
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}

    def augment(record):
        example = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_image(example["image"], channels=1, expand_animations=False)
        image = tf.image.random_crop(image, [24, 24, 1])
        image = tf.image.resize(image, [28, 28])
        image = tf.image.random_flip_left_right(image)
        image = (image - 0.2860 * 255.0) / (0.3530 * 255.0)
        return image, example["label"]

    options = tf.data.Options()
    options.threading.private_threadpool_size = args.threads
    files = sorted(glob.glob(args.files))
    ds = (tf.data.TFRecordDataset(files)
          .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(args.batch)
          .prefetch(tf.data.AUTOTUNE)
          .with_options(options))
    print(f"tf.data: {len(files)} files, tensorflow {tf.__version__}, {args.threads} threads")
    rates = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        examples = 0
        pixel_sum = 0.0  # a check that both pipelines computed the same kind of images
        for images, _ in ds:
            examples += int(images.shape[0])
            pixel_sum += float(tf.reduce_sum(tf.cast(images, tf.float64)))
        seconds = time.perf_counter() - start
        rates.append(examples / seconds)
        print(f"epoch {epoch}: {seconds:.3f} s, {examples} examples, {rates[-1]:.0f} examples/s, "
              f"mean pixel {pixel_sum / (examples * 28 * 28):.4f}", flush=True)
    print(f"median examples/s: {statistics.median(rates):.0f}")


if __name__ == "__main__":
    main()
