#!/usr/bin/env bash
# Runs every fuzz target of the module (each func FuzzXxx in a _test.go file) for FUZZTIME (default 20s)
# each, one at a time: `go test -run '^$' -fuzz '^FuzzXxx$' -fuzztime 20s ./pkg`. Every failure is reported
# at the end; Go writes each failing input to the package's testdata/fuzz/FuzzXxx/, which is to be
# committed (it then runs as a seed in every plain `go test`), after the bug is fixed. A target that fails
# only with Go 1.26's fuzzing coordinator race (a bare "context deadline exceeded" at the end of -fuzztime,
# no failing input written; go.dev/issue/75804, fixed in Go 1.27) runs once more; a second such failure,
# or any other, fails.
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

# fuzz_one runs one target; it returns 0 when it passed, 1 when it failed, and 2 when it failed only with
# Go's fuzzing coordinator race (go.dev/issue/75804, fixed in Go 1.27): "context deadline exceeded" right
# at the end of -fuzztime, on a loaded host, with no failing input written.
fuzz_one() {
  local pkg=$1 name=$2 corpus="$1/testdata/fuzz/$2" before after log rc=0
  before=$(ls "$corpus" 2>/dev/null | sort || true)
  log=$(mktemp)
  $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$log" >&2 || rc=1
  after=$(ls "$corpus" 2>/dev/null | sort || true)
  if [ $rc = 1 ] && [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' "$log" &&
    ! grep -q 'Failing input written\|panic:' "$log"; then
    rc=2
  fi
  rm -f "$log"
  return $rc
}

failed=()
for t in "${targets[@]}"; do
  pkg=${t%%:*} name=${t#*:}
  printf '== fuzz %s %s for %s\n' "$pkg" "$name" "$FUZZTIME" >&2
  start=$SECONDS
  rc=0
  fuzz_one "$pkg" "$name" || rc=$?
  if [ $rc = 2 ]; then
    echo "== $name ended with Go's fuzzing coordinator race (context deadline exceeded, no failing input): once more" >&2
    rc=0
    fuzz_one "$pkg" "$name" || rc=$?
  fi
  if [ $rc != 0 ]; then
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
