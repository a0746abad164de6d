# Python modules: keras, h5py, numpy (a Python with TensorFlow and Keras 3; exits 77 without them)
"""Keras 3's MultiHeadAttention from known weights, for the parity test of Tandem's
(tests/nn/test_attention_keras.cpp): outputs and gradients, self-attention causal and not, and
cross-attention with value_dim, output_shape and an attention mask.

usage: keras_attention.py OUT_DIR                   Keras writes
       keras_attention.py OUT_DIR --load FILE CASE  Keras reads Tandem's weights of CASE

  Cases (all float32, batch 2):
    self_causal  MultiHeadAttention(num_heads=2, key_dim=4) on x [2, 7, 6], use_causal_mask=True
    self         the same without the causal mask
    cross        MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5, output_shape=8) with
                 query [2, 7, 6] and value [2, 9, 5] (key = value), attention_mask [2, 7, 9]
  Per case in OUT_DIR: <case>.weights.h5 (a Keras 3 functional model holding the layer),
  <case>_legacy.h5 (Keras's legacy h5 weights), the inputs <case>_query.f32,
  <case>_value.f32, <case>_mask.u8 (cross only), a weight <case>_w.f32 of the output's shape,
  the output <case>_out.f32 and, of sum(out * w), the gradients with respect to the query
  (<case>_dquery.f32), the value (<case>_dvalue.f32, cross only) and every weight in Keras's
  order (<case>_dweights.f32, concatenated).
  Reading: the same model loads FILE (Tandem's checkpoint or .weights.h5) and writes its output
  for the case's inputs to OUT_DIR/<case>_loaded.f32.
Exit status: 0 done, 1 failed, 77 TensorFlow or Keras 3 is missing.
"""
import argparse
import os
import sys

from interop_common import require_keras3

np, tf, keras = require_keras3()

CASES = {
    "self_causal": dict(heads=2, key_dim=4, value_dim=None, output_shape=None, causal=True,
                        cross=False),
    "self": dict(heads=2, key_dim=4, value_dim=None, output_shape=None, causal=False,
                 cross=False),
    "cross": dict(heads=3, key_dim=4, value_dim=5, output_shape=8, causal=False, cross=True),
}


def build(case):
    """The functional model holding one MultiHeadAttention, and its inputs (seeded)."""
    c = CASES[case]
    rng = np.random.default_rng(len(case))
    query = rng.uniform(-1, 1, (2, 7, 6)).astype(np.float32)
    value = rng.uniform(-1, 1, (2, 9, 5)).astype(np.float32) if c["cross"] else query
    mask = None
    if c["cross"]:
        mask = (rng.uniform(0, 1, (2, 7, 9)) > 0.3).astype(np.uint8)
        mask[:, :, 0] = 1  # every query sees a key
    layer = keras.layers.MultiHeadAttention(
        num_heads=c["heads"], key_dim=c["key_dim"], value_dim=c["value_dim"],
        output_shape=c["output_shape"])
    q_in = keras.Input(query.shape[1:])
    if c["cross"]:
        v_in = keras.Input(value.shape[1:])
        m_in = keras.Input(mask.shape[1:], dtype="bool")
        out = layer(q_in, v_in, attention_mask=m_in)
        model = keras.Model([q_in, v_in, m_in], out)
    else:
        out = layer(q_in, q_in, use_causal_mask=c["causal"])
        model = keras.Model(q_in, out)
    # Weights with some spread (the biases too, which Keras starts at zero).
    for w in layer.weights:
        w.assign(rng.uniform(-0.5, 0.5, w.shape).astype(np.float32))
    return model, layer, query, value, mask


def inputs_of(case, query, value, mask):
    if CASES[case]["cross"]:
        return [tf.constant(query), tf.constant(value), tf.constant(mask.astype(bool))]
    return tf.constant(query)


def write(out_dir):
    from keras.src.legacy.saving import legacy_h5_format
    import h5py
    for case in CASES:
        model, layer, query, value, mask = build(case)
        model.save_weights(os.path.join(out_dir, f"{case}.weights.h5"))
        with h5py.File(os.path.join(out_dir, f"{case}_legacy.h5"), "w") as f:
            legacy_h5_format.save_weights_to_hdf5_group(f, model)
        query.tofile(os.path.join(out_dir, f"{case}_query.f32"))
        if CASES[case]["cross"]:
            value.tofile(os.path.join(out_dir, f"{case}_value.f32"))
            mask.tofile(os.path.join(out_dir, f"{case}_mask.u8"))
        q = tf.Variable(query)
        v = tf.Variable(value)
        with tf.GradientTape() as tape:
            if CASES[case]["cross"]:
                out = model([q, v, tf.constant(mask.astype(bool))])
            else:
                out = model(q)
            w = np.random.default_rng(99).uniform(-1, 1, out.shape).astype(np.float32)
            loss = tf.reduce_sum(out * w)
        sources = [q] + ([v] if CASES[case]["cross"] else []) + [x.value for x in layer.weights]
        grads = tape.gradient(loss, sources)
        w.tofile(os.path.join(out_dir, f"{case}_w.f32"))
        out.numpy().tofile(os.path.join(out_dir, f"{case}_out.f32"))
        grads[0].numpy().tofile(os.path.join(out_dir, f"{case}_dquery.f32"))
        rest = grads[1:]
        if CASES[case]["cross"]:
            rest[0].numpy().tofile(os.path.join(out_dir, f"{case}_dvalue.f32"))
            rest = rest[1:]
        np.concatenate([g.numpy().ravel() for g in rest]).tofile(
            os.path.join(out_dir, f"{case}_dweights.f32"))


def load(out_dir, path, case):
    model, _, query, value, mask = build(case)
    model.load_weights(path)
    out = model(inputs_of(case, query, value, mask))
    out.numpy().tofile(os.path.join(out_dir, f"{case}_loaded.f32"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--load", nargs=2, metavar=("FILE", "CASE"))
    args = parser.parse_args()
    if args.load:
        load(args.out_dir, args.load[0], args.load[1])
    else:
        write(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
