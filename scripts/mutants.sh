#!/usr/bin/env bash
# make mutants: mutation testing (gremlins, github.com/go-gremlins/gremlins, built once from the Go module
# proxy) over the code where a silent bug costs the most. Each target is one package, mutated only in the
# files named, and tested by that package's own tests (a per-test target: by those of them that run the
# mutated position, see TARGETS); targets run one at a time, each under
# MUTANTS_TIMEOUT. gremlins never runs the mutants it finds NOT COVERED, which include every mutant in a
# switch's case conditions (no coverage block holds them): scripts/mutants_recheck.py applies and tests
# each of those. For each target it prints the mutants killed, those that lived or that no test covers
# (both survivors), and the kill rate over the non-equivalent mutants: killed / (killed + survivors not
# marked equivalent in the baseline). It fails when a target is below MUTANTS_MIN (90%), when a survivor
# is missing from the baseline (a new one: kill it with a test, or list it as equivalent with the reason),
# or when a mutant the baseline says a test kills lived.
#
# The baseline, scripts/mutants-baseline.txt, lists every survivor ever seen, one a line:
#   FILE:LINE:COLUMN MUTATOR equivalent: why no test can tell it from the original
#   FILE:LINE:COLUMN MUTATOR killed: TestThatNowKillsIt
#   FILE:LINE:COLUMN MUTATOR open: what a test must show to kill it (known, not yet killed: it counts
#                                  against the kill rate but does not fail the run as a new survivor)
# Lines move when the code does: a baseline entry no mutant matches is reported as stale (fix its
# position). docs/reliability.md (make mutants) says what it covers and its last measured rates.
#
#   scripts/mutants.sh                        every target
#   scripts/mutants.sh deniedpath fencing     only the targets named
#   MUTANTS_TIMEOUT=60m MUTANTS_WORKERS=2 scripts/mutants.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
GREMLINS_VERSION=v0.6.0
MUTANTS_TIMEOUT=${MUTANTS_TIMEOUT:-30m}
MUTANTS_MIN=${MUTANTS_MIN:-90}
MUTANTS_WORKERS=${MUTANTS_WORKERS:-1}
BASELINE=scripts/mutants-baseline.txt
OUT=${MUTANTS_OUT:-.data/mutants}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/toolpool

# TARGETS: name, package directory, the files mutated (a regular expression over file names), and for a
# package whose whole suite is too slow to run per mutant, "per-test": each mutant then runs against only
# the tests that execute its position, as measured by scripts/mutants_tests.py (its doc says how), and
# gremlins only finds the mutants.
TARGETS=(
  "deniedpath internal/policy/deniedpath ^deniedpath\.go$"
  "posture internal/policy ^(posture|decision)\.go$"
  "fencing internal/worker ^fencing\.go$"
  "lease internal/queue/jetstream ^(lease|records|output)\.go$ per-test"
  "workspace internal/workspace ^(archive|limits)\.go$"
  "admission internal/dispatcher ^(service|approvals)\.go$"
  "incontainer internal/tools/incontainer ^(edit_file|glob|grep|read|list|write)[a-z_]*\.go$"
)

GREMLINS=${GREMLINS:-$CACHE/gremlins-$GREMLINS_VERSION/gremlins}
if [ ! -x "$GREMLINS" ]; then
  echo "mutants: building gremlins $GREMLINS_VERSION from the Go module proxy into $(dirname "$GREMLINS") (once)" >&2
  mkdir -p "$(dirname "$GREMLINS")"
  GOBIN=$(cd "$(dirname "$GREMLINS")" && pwd) GOFLAGS=-mod=mod $GO install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
fi
mkdir -p "$OUT"
touch "$BASELINE"

failed=()
summary=()
for target in "${TARGETS[@]}"; do
  read -r name dir files mode <<< "$target"
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then
    continue
  fi
  # gremlins mutates every file under the path it is given, subdirectories included, and tests each
  # mutant with its own package's tests: leave out the package's other files and its subpackages (its
  # exclusions match paths relative to that path).
  excludes=(-E "/")
  for f in "$dir"/*.go; do
    base=$(basename "$f")
    if [[ $base != *_test.go ]] && ! [[ $base =~ $files ]]; then
      excludes+=(-E "^${base//./\\.}\$")
    fi
  done
  echo "mutants: $name ($dir, files $files${mode:+, $mode}), timeout $MUTANTS_TIMEOUT" >&2
  json="$OUT/$name.json"
  rm -f "$json"
  # per-test: measure which tests run which code of the files, then let gremlins only find the mutants
  # (it runs no test: every mutant is NOT COVERED) and the recheck below test each against its tests.
  tests=()
  find=()
  only=()
  if [ "$mode" = per-test ]; then
    tests=("$OUT/$name-tests.json")
    if ! python3 scripts/mutants_tests.py "$dir" "$files" "${tests[0]}" 2> "$OUT/$name-tests.log"; then
      echo "mutants: $name: measuring which tests run the code failed:" >&2
      tail -20 "$OUT/$name-tests.log" >&2
      failed+=("$name: no test selection")
      continue
    fi
    find=(--dry-run)
    only=("GOFLAGS=-run=^\$ ${GOFLAGS:-}")
  fi
  if ! env "${only[@]}" timeout "$MUTANTS_TIMEOUT" "$GREMLINS" unleash --silent --workers "$MUTANTS_WORKERS" --test-cpu 1 --invert-logical \
      "${find[@]}" "${excludes[@]}" -o "$json" "./$dir" > "$OUT/$name.log" 2>&1; then
    echo "mutants: $name: gremlins failed or ran out of time (MUTANTS_TIMEOUT=$MUTANTS_TIMEOUT):" >&2
    tail -20 "$OUT/$name.log" >&2
    failed+=("$name: did not finish")
    continue
  fi
  # gremlins never runs the mutants it finds NOT COVERED, among them every one in a switch's case
  # conditions: run them (scripts/mutants_recheck.py says why).
  python3 scripts/mutants_recheck.py "$json" "$dir" "${MUTANTS_TEST_TIMEOUT:-5m}" "${tests[@]}"
  # One line per survivor: FILE:LINE:COLUMN MUTATOR STATUS, FILE relative to the module.
  python3 - "$json" "$dir" "$BASELINE" "$MUTANTS_MIN" "$name" <<'EOF' || failed+=("$name")
import json, sys
path, pkgdir, baseline, minimum, name = sys.argv[1:]
data = json.load(open(path))
base = {}
for line in open(baseline):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    key, _, verdict = line.partition(" ")
    mutator, _, verdict = verdict.partition(" ")
    base[(key, mutator)] = verdict
killed, survivors, bad = 0, [], []
for f in data.get("files", []):
    fn = f["file_name"]
    if not fn.startswith(pkgdir + "/"):
        fn = pkgdir + "/" + fn.split("/")[-1]
    for m in f["mutations"]:
        st = m["status"]
        if st in ("KILLED",):
            killed += 1
        elif st in ("LIVED", "NOT COVERED"):
            survivors.append((f"{fn}:{m['line']}:{m['column']}", m["type"], st))
        # NOT VIABLE (does not compile), TIMED OUT (counted as killed by gremlins) and SKIPPED are neither.
        if st == "TIMED OUT":
            killed += 1
equivalent = 0
for key, mutator, st in survivors:
    verdict = base.get((key, mutator))
    if verdict is None:
        bad.append(f"  NEW survivor {key} {mutator} ({st}): kill it with a test, or add it to {baseline} as equivalent, with why")
    elif verdict.startswith("equivalent:"):
        equivalent += 1
    elif verdict.startswith("open:"):
        pass  # known, not yet killed: it counts against the kill rate
    else:
        bad.append(f"  {key} {mutator} ({st}) lived, but {baseline} says '{verdict}'")
alive = {(k, m) for k, m, _ in survivors}
stale = [f"{k} {m}" for (k, m), v in base.items() if k.startswith(pkgdir + "/") and "/" not in k[len(pkgdir) + 1:]
         and v.startswith("equivalent:") and (k, m) not in alive]
real = killed + len(survivors) - equivalent
rate = 100.0 * killed / real if real else 100.0
print(f"{name:12s} killed {killed:4d}  survived {len(survivors):3d} (equivalent {equivalent:3d})  kill rate {rate:5.1f}% of {real} non-equivalent")
for b in bad:
    print(b)
for e in stale:
    print(f"  note: baseline entry {e} (equivalent) matched no survivor: its code moved or a test kills it now; update {baseline}")
if bad or rate < float(minimum):
    sys.exit(1)
EOF
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "mutants: FAILED: ${failed[*]} (details above; results in $OUT)" >&2
  exit 1
fi
echo "mutants: every target at or above ${MUTANTS_MIN}% of its non-equivalent mutants killed (results in $OUT)" >&2
