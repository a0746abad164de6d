#!/usr/bin/env bash
# Tandem's image input pipeline (bench_image_pipeline) against tf.data's
# (bench/peers/tf_image_pipeline.py) on the same TFRecord files of Fashion-MNIST images, encoded
# by TensorFlow as PNG and as JPEG (bench/peers/make_image_tfrecords.py), the same cores and the
# same steps: parse, decode, random crop + resize, random flip, normalize, batch 256, both with
# their parallel map. The contenders alternate, one process each, for --rounds rounds; the
# table gives the median over rounds of each run's median epoch, and the ratio.
#
#   bench/image_pipeline.sh [--rounds 3] [--epochs 3] [--formats png,jpeg] [--threads 2]
#                           [--build DIR] [--python PATH]
#
#   --build DIR   build folder (default build/): the bench, the files and the venv live there
#   --python P    a Python with tensorflow-cpu 2.21 (default: the venv bench/peers/run installs)
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
TANDEM_LOG_NAME=image-pipeline
cd "$TANDEM_ROOT"

rounds=3 epochs=3 formats=png,jpeg threads=2 build=build python=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --formats) formats="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (bench/image_pipeline.sh --help)" ;;
  esac
done
[[ "$build" = /* ]] || build="$TANDEM_ROOT/$build"
if [[ -z "$python" ]]; then
  bench/peers/run --install-only --build "$build"
  python="$build/bench-peers-venv/bin/python"
fi
[[ -f "$build/CMakeCache.txt" ]] || cmake -S "$TANDEM_ROOT" -B "$build" >/dev/null
note "building bench_image_pipeline in $build (-j$TANDEM_JOBS)"
cmake --build "$build" -j"$TANDEM_JOBS" --target bench_image_pipeline >/dev/null

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
rate_of() { sed -n 's/^median examples\/s: //p' "$1"; }

IFS=, read -r -a format_list <<<"$formats"
logs="$build/image-pipeline-logs"
mkdir -p "$logs"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; isa: $(grep -o -w -E 'avx512f|avx512_bf16|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
printf '%-6s %16s %16s %8s\n' format "tandem ex/s" "tf.data ex/s" ratio
for format in "${format_list[@]}"; do
  files="$build/image-tfrecords/$format"
  if ! compgen -G "$files/*.tfrecord" >/dev/null; then
    "$python" bench/peers/make_image_tfrecords.py "$files" --format "$format" >&2
  fi
  tandem_rates=() tf_rates=()
  for ((r = 0; r < rounds; ++r)); do
    "$build/bench/bench_image_pipeline" --files "$files/*.tfrecord" --epochs "$epochs" \
      --threads "$threads" >"$logs/tandem-$format-$r.log"
    tandem_rates+=("$(rate_of "$logs/tandem-$format-$r.log")")
    "$python" bench/peers/tf_image_pipeline.py --files "$files/*.tfrecord" --epochs "$epochs" \
      --threads "$threads" >"$logs/tf-$format-$r.log" 2>"$logs/tf-$format-$r.err"
    tf_rates+=("$(rate_of "$logs/tf-$format-$r.log")")
  done
  t="$(printf '%s\n' "${tandem_rates[@]}" | median)"
  f="$(printf '%s\n' "${tf_rates[@]}" | median)"
  printf '%-6s %16.0f %16.0f %7.2fx\n' "$format" "$t" "$f" "$(awk -v a="$t" -v b="$f" 'BEGIN {print a / b}')"
done
echo "per-epoch lines (with each run's mean pixel, which both must agree on): $logs"
