#!/usr/bin/env bash
# Prints the escape suite's results under runc and under gVisor side by side, as a Markdown table: each case
# of TestEscape, PASS / FAIL / SKIP under each runtime, and what the host could not show (NOT TRIED, NOT
# CHECKED). docs/security.md keeps the table of the last run.
#
#   scripts/escape-results.sh                     run TestEscape -v under both runtimes (root, containerd, runsc)
#   scripts/escape-results.sh RUNC.log GVISOR.log  only build the table from two `go test -v` outputs
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -eq 0 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  for rt in runc gvisor; do
    TOOLPOOL_TEST_RUNTIME=$rt go test -count=1 -timeout 30m -v -run '^TestEscape$' ./internal/sandbox/containerd/ >"$work/$rt.log" 2>&1 || true
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

declare -A gv gvnote
while IFS=$'\t' read -r name r note; do gv[$name]=$r; gvnote[$name]=$note; done < <(results "$2")
echo "| case | runc | gVisor |"
echo "| --- | --- | --- |"
while IFS=$'\t' read -r name r note; do
  g=${gv[$name]:-not run}
  printf '| `%s` | %s%s | %s%s |\n' "$name" "$r" "${note:+ ($note)}" "$g" "${gvnote[$name]:+ (${gvnote[$name]})}"
done < <(results "$1")
