#!/usr/bin/env bash
# Runs the escape suite (TestEscape) under runc and under gVisor and prints its results side by side, as a
# Markdown table: each case, PASS / FAIL / SKIP under each runtime, and what the host could not show (NOT
# TRIED, NOT CHECKED); then how long the suite took under each. docs/security.md keeps the table of the last
# run. make test runs the escape suite this way (with -race), instead of in its pass over the sandbox package.
#
#   scripts/escape-results.sh                      run TestEscape -v under both runtimes (root, containerd,
#                                                  runsc); exit 1, after the table and the failing run's log,
#                                                  when either run fails
#   scripts/escape-results.sh RUNC.log GVISOR.log  only build the table from two `go test -v` outputs
#
# GOTESTFLAGS adds flags to both go test runs (make test: -race -timeout 40m). ESCAPE_SKIP, when set, is a
# go test -skip pattern of cases to leave out (make test's subset on an image). TOOLPOOL_TEST_IMAGE=1 runs
# every call of the suite on an OCI image pulled from a registry the suite starts (the table says so).
# ESCAPE_RESULTS_DIR, when set, keeps both logs and the table there (runc.log, gvisor.log, escape-results.md).
set -euo pipefail
cd "$(dirname "$0")/.."

# where says where the suite's calls run: on an image (TOOLPOOL_TEST_IMAGE=1) or, by default, on the host view.
where() {
  if [ "${TOOLPOOL_TEST_IMAGE:-}" = 1 ]; then echo " on an image"; fi
}

failed=()
if [ $# -eq 0 ]; then
  work=${ESCAPE_RESULTS_DIR:-}
  if [ -z "$work" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
  fi
  mkdir -p "$work"
  skip=()
  [ -n "${ESCAPE_SKIP:-}" ] && skip=(-skip "$ESCAPE_SKIP")
  for rt in runc gvisor; do
    echo "escape suite under $rt$(where): go test ${GOTESTFLAGS:-} -count=1 -v -run '^TestEscape\$' ${skip[*]} ./internal/sandbox/containerd/ ($(uptime | sed 's/.*load/load/'))" >&2
    # shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
    if ! TOOLPOOL_TEST_RUNTIME=$rt go test ${GOTESTFLAGS:-} -count=1 -v -run '^TestEscape$' "${skip[@]}" ./internal/sandbox/containerd/ >"$work/$rt.log" 2>&1; then
      failed+=("$rt")
    fi
  done
  set -- "$work/runc.log" "$work/gvisor.log"
fi
[ $# -eq 2 ] || { echo "usage: $0 [RUNC.log GVISOR.log]" >&2; exit 2; }

# results LOG: one line per TestEscape subtest, "name<TAB>RESULT<TAB>notes"; the notes are the test's own
# NOT TRIED / NOT CHECKED lines, logged while the subtest ran.
results() {
  awk '
    /^=== (RUN|NAME|CONT|PAUSE) +TestEscape\// { cur = $3; sub(/^TestEscape\//, "", cur); if (!(cur in seen)) { seen[cur] = 1; order[++n] = cur } next }
    /^ *--- (PASS|FAIL|SKIP): TestEscape\// { name = $3; sub(/^TestEscape\//, "", name); res[name] = $2; sub(/:$/, "", res[name]); next }
    /NOT (TRIED|CHECKED)/ && cur != "" { line = $0; sub(/^.*NOT /, "NOT ", line); sub(/:.*/, "", line); note[cur] = line }
    END { for (i = 1; i <= n; i++) printf "%s\t%s\t%s\n", order[i], res[order[i]] ? res[order[i]] : "not run", note[order[i]] }
  ' "$1"
}

# took LOG: how long the whole TestEscape took, from its "--- PASS: TestEscape (12.34s)" line.
took() {
  sed -n 's/^--- [A-Z]*: TestEscape (\(.*\))$/\1/p' "$1" | tail -1
}

table() {
  declare -A gv gvnote
  while IFS=$'\t' read -r name r note; do gv[$name]=$r; gvnote[$name]=$note; done < <(results "$2")
  echo "| case | runc | gVisor |"
  echo "| --- | --- | --- |"
  while IFS=$'\t' read -r name r note; do
    g=${gv[$name]:-not run}
    printf '| `%s` | %s%s | %s%s |\n' "$name" "$r" "${note:+ ($note)}" "$g" "${gvnote[$name]:+ (${gvnote[$name]})}"
  done < <(results "$1")
  echo
  echo "TestEscape$(where) took ${runc_took:-?} under runc and ${gvisor_took:-?} under gVisor."
}

runc_took=$(took "$1")
gvisor_took=$(took "$2")
if [ -n "${ESCAPE_RESULTS_DIR:-}" ]; then
  table "$@" | tee "$ESCAPE_RESULTS_DIR/escape-results.md"
else
  table "$@"
fi
for rt in "${failed[@]}"; do
  log=$1
  [ "$rt" = gvisor ] && log=$2
  echo >&2
  echo "the escape suite FAILED under $rt; its log:" >&2
  cat "$log" >&2
done
[ ${#failed[@]} -eq 0 ]
