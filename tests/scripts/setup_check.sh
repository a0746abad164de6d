#!/usr/bin/env bash
# scripts/setup --check: a list naming a package that is not installed exits non-zero and
# names it, and installs nothing; the project's own list is complete on a set-up machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
setup="$root/scripts/setup"
absent=tandem-no-such-package-for-the-check

status=0
out="$("$setup" --check "$absent" coreutils 2>&1)" || status=$?
echo "$out"
[[ $status -ne 0 ]] || { echo "FAIL: --check with $absent exited 0"; exit 1; }
grep -q "$absent" <<<"$out" || { echo "FAIL: --check did not name $absent"; exit 1; }
if grep -q coreutils <<<"$out"; then echo "FAIL: --check named coreutils, which is installed"; exit 1; fi
grep -q "apt-get" <<<"$out" && { echo "FAIL: --check ran apt-get"; exit 1; }

status=0
out="$("$setup" --check coreutils 2>&1)" || status=$?
echo "$out"
[[ $status -eq 0 ]] || { echo "FAIL: --check coreutils exited $status"; exit 1; }

# The project's list: the tests run after scripts/setup, so nothing may be missing.
"$setup" --check || { echo "FAIL: scripts/setup --check found packages missing"; exit 1; }
echo "ok"
