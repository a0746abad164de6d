#!/usr/bin/env bash
# scripts/check-deps: a build that read a file of a package scripts/setup does not install
# fails and names the package; a build that read only allowed files passes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
check="$root/scripts/check-deps"
work="$(mktemp -d /tmp/tandem-check-deps.XXXXXX)"
trap 'rm -rf "$work"' EXIT

allowed="$("$check" --list-allowed)"
# A header of an installed package that is not allowed: the first such package found.
intruder="" header=""
while read -r package; do
  grep -qx "$package" <<<"$allowed" && continue
  header="$(dpkg -L "$package" 2>/dev/null | grep -E '^/usr/(include|lib)/.*\.(h|hpp|so)$' |
            while read -r f; do [[ -f "$f" && ! -L "$f" ]] && { echo "$f"; break; }; done || true)"
  if [[ -n "$header" ]]; then intruder="$package"; break; fi
done < <(dpkg-query -W -f='${db:Status-Status} ${Package}\n' | awk '$1=="installed"{print $2}')
[[ -n "$intruder" ]] || { echo "SKIP: every installed package is allowed"; exit 77; }
echo "a file of $intruder, which scripts/setup does not install: $header"

# An allowed header (zlib's, from zlib1g-dev in scripts/setup).
mkdir -p "$work/clean/CMakeFiles/t.dir" "$work/dirty/CMakeFiles/t.dir"
printf 'x.o: /usr/include/zlib.h \\\n /usr/include/stdio.h\n' > "$work/clean/CMakeFiles/t.dir/x.o.d"
"$check" --quiet "$work/clean" || { echo "FAIL: a build reading zlib.h and stdio.h was refused"; exit 1; }

# A launcher script outside any package that starts the optional CUDA toolkit's nvcc (some
# images put one on PATH) is the toolkit's; one that starts anything else is unowned.
mkdir -p "$work/launch/CMakeFiles" "$work/bin"
printf '#!/bin/sh\nexec /usr/local/cuda-13.0/bin/nvcc "$@"\n' > "$work/bin/nvcc"
printf '#!/bin/sh\nexec /opt/elsewhere/bin/tool "$@"\n' > "$work/bin/tool"
chmod +x "$work/bin/nvcc" "$work/bin/tool"
printf 'TANDEM_NVCC:FILEPATH=%s\n' "$work/bin/nvcc" > "$work/launch/CMakeCache.txt"
"$check" --quiet "$work/launch" || { echo "FAIL: a launcher of /usr/local/cuda's nvcc was refused"; exit 1; }
printf 'TANDEM_NVCC:FILEPATH=%s\n' "$work/bin/tool" > "$work/launch/CMakeCache.txt"
if "$check" --quiet "$work/launch" >/dev/null; then
  echo "FAIL: a launcher of a tool outside the CUDA toolkit was accepted"; exit 1
fi

printf 'x.o: /usr/include/zlib.h \\\n %s\n' "$header" > "$work/dirty/CMakeFiles/t.dir/x.o.d"
status=0
out="$("$check" --quiet "$work/dirty" 2>&1)" || status=$?
echo "$out"
[[ $status -eq 1 ]] || { echo "FAIL: exit $status, expected 1"; exit 1; }
grep -q "NOT INSTALLED BY scripts/setup: $intruder " <<<"$out" ||
  { echo "FAIL: $intruder not named"; exit 1; }
echo "ok"
