#!/usr/bin/env bash
# Runs every fuzz target of the module (each func FuzzXxx in a _test.go file) for FUZZTIME (default 20s)
# each, one at a time: `go test -run '^$' -fuzz '^FuzzXxx$' -fuzztime 20s ./pkg`. Every failure is reported
# at the end; Go writes each failing input to the package's testdata/fuzz/FuzzXxx/, which is to be
# committed (it then runs as a seed in every plain `go test`), after the bug is fixed.
#
#   scripts/fuzz.sh                  every fuzzer, 20 s each
#   FUZZTIME=2m scripts/fuzz.sh      longer
#   scripts/fuzz.sh FuzzGlob         only the fuzzers named
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}

files=$(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go' -not -path './.data/*')
targets=()
for f in $files; do
  for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
    if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then
      continue
    fi
    targets+=("./$(dirname "$f"):$name")
  done
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz targets found${*:+ named $*}" >&2
  exit 1
fi

failed=()
for t in "${targets[@]}"; do
  pkg=${t%%:*} name=${t#*:}
  printf '== fuzz %s %s for %s\n' "$pkg" "$name" "$FUZZTIME" >&2
  start=$SECONDS
  if ! $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >&2; then
    failed+=("$pkg $name")
  fi
  printf '== %s took %ds\n' "$name" $((SECONDS - start)) >&2
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  echo "fuzz: the failing inputs are in testdata/fuzz/ of those packages: fix the bug (or the harness), then commit them" >&2
  git status --short -- '*testdata/fuzz/*' >&2 2>/dev/null || true
  exit 1
fi
echo "fuzz: ${#targets[@]} fuzz targets, $FUZZTIME each: no failure" >&2
