# Python modules: tensorboard (the build folder's tensorboard-venv, made by scripts/tensorboard-venv)
"""Reads a log folder with TensorBoard's own reader (EventAccumulator) and prints one line per
value it found, floats as Python's repr (exact):
  scalar TAG STEP VALUE
  histogram TAG STEP MIN MAX NUM SUM SUM_SQUARES LIMIT,LIMIT,... COUNT,COUNT,...
  text TAG STEP TEXT (as JSON: a quoted string)

usage: read_events.py LOGDIR      (exit 77 when the tensorboard package is missing)
"""
import json
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError:
    print("read_events.py: the tensorboard package is missing", file=sys.stderr)
    sys.exit(77)


def main():
    accumulator = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0,
                                    event_accumulator.HISTOGRAMS: 0,
                                    event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    for tag in tags.get("scalars", []):
        for e in accumulator.Scalars(tag):
            print("scalar", tag, e.step, repr(e.value))
    for tag in tags.get("histograms", []):
        for e in accumulator.Histograms(tag):
            h = e.histogram_value
            print("histogram", tag, e.step, repr(h.min), repr(h.max), repr(h.num), repr(h.sum),
                  repr(h.sum_squares), ",".join(repr(x) for x in h.bucket_limit),
                  ",".join(repr(x) for x in h.bucket))
    for tag in tags.get("tensors", []):
        for e in accumulator.Tensors(tag):
            if e.tensor_proto.string_val:
                print("text", tag, e.step, json.dumps(e.tensor_proto.string_val[0].decode()))

if __name__ == "__main__":
    main()
