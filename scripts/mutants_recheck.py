#!/usr/bin/env python3
"""Tests the mutants gremlins reports NOT COVERED, which it never runs, and rewrites their status.

gremlins decides coverage from the package's coverage profile, whose blocks hold statements only: the
conditions of a switch's case clauses (`case s == "" && i > 0:`) lie in no block, so every mutant there
is NOT COVERED however many tests run through it. This applies each such mutant to a copy of the module
(the operator at its line and byte column; the working tree is never changed), runs the package's tests
there, restores the file, and records NOT VIABLE (it does not compile), KILLED (the tests failed) or
LIVED. A mutant whose operator it cannot find keeps NOT COVERED.

With TESTS.json (scripts/mutants_tests.py: which tests run which coverage block of the mutated files),
each mutant runs against only the tests that run its position (go test -run), and one in no block (a
case condition, a declaration) against the tests that run any block of its file; a mutant no test runs
keeps NOT COVERED. scripts/mutants.sh uses it for the targets whose whole suite is too slow to run per
mutant, and then has gremlins only find the mutants (--dry-run, every one NOT COVERED).

    mutants_recheck.py RESULTS.json PACKAGE_DIR TIMEOUT [TESTS.json]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SWAPS = {
    "CONDITIONALS_NEGATION": {"==": "!=", "!=": "==", "<=": ">", ">=": "<", "<": ">=", ">": "<="},
    "CONDITIONALS_BOUNDARY": {"<=": "<", ">=": ">", "<": "<=", ">": ">="},
    "INVERT_LOGICAL": {"&&": "||", "||": "&&"},
    "ARITHMETIC_BASE": {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*"},
    "INVERT_NEGATIVES": {"-": "+"},
    "INCREMENT_DECREMENT": {"++": "--", "--": "++"},
    "INVERT_LOOPCTRL": {"break": "continue", "continue": "break"},
}


def mutate(line, col, kind):
    """Returns line with the operator at byte column col (1-based) swapped, or None."""
    i = col - 1
    swaps = SWAPS.get(kind, {})
    for op in sorted(swaps, key=len, reverse=True):
        if line[i:i + len(op)] == op:
            return line[:i] + swaps[op] + line[i + len(op):]
    return None


def main():
    path, pkgdir, timeout = sys.argv[1], sys.argv[2], sys.argv[3]
    covered = load_tests(sys.argv[4]) if len(sys.argv) > 4 else None
    data = json.load(open(path))
    todo = [m for f in data.get("files", []) for m in f["mutations"] if m["status"] == "NOT COVERED"]
    if not todo:
        return
    module = tempfile.mkdtemp(prefix="toolpool-mutants-")
    try:
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], check=True, capture_output=True).stdout.decode().split("\0")
        for rel in filter(None, files):
            if os.path.isfile(rel):
                os.makedirs(os.path.join(module, os.path.dirname(rel)), exist_ok=True)
                shutil.copy2(rel, os.path.join(module, rel))
        recheck(data, pkgdir, timeout, module, covered)
    finally:
        shutil.rmtree(module, ignore_errors=True)
    json.dump(data, open(path, "w"))


def load_tests(path):
    """Returns a function giving the tests that run a position of a file (a go test -run expression), or
    None when no test runs that file."""
    data = json.load(open(path))
    blocks = data["blocks"]

    def tests_for(base, line, col):
        inside = {t for b, sl, sc, el, ec, ts in blocks if b == base and (sl, sc) <= (line, col) <= (el, ec) for t in ts}
        if not inside:
            inside = {t for b, *_, ts in blocks if b == base for t in ts}
        if not inside:
            return None
        return "^(" + "|".join(sorted(inside)) + ")$"
    return tests_for


def recheck(data, pkgdir, timeout, module, covered=None):
    for f in data.get("files", []):
        shown = os.path.join(pkgdir, os.path.basename(f["file_name"]))
        name = os.path.join(module, shown)
        for m in f["mutations"]:
            if m["status"] != "NOT COVERED":
                continue
            selection = []
            if covered is not None:
                run = covered(os.path.basename(shown), m["line"], m["column"])
                if run is None:
                    continue
                selection = ["-run", run]
            with open(name, "rb") as fh:
                original = fh.read()
            lines = original.decode().split("\n")
            changed = mutate(lines[m["line"] - 1], m["column"], m["type"])
            if changed is None:
                continue
            lines[m["line"] - 1] = changed
            try:
                with open(name, "w") as fh:
                    fh.write("\n".join(lines))
                # A mutant that does not compile (a string's + made a -) is not viable, as gremlins says;
                # one that compiles but that go test's vet refuses is killed, as under gremlins.
                build = subprocess.run(["go", "test", "-vet=off", "-count=1", "-run", "^$", "./" + pkgdir], cwd=module,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                r = build
                if build.returncode == 0:
                    r = subprocess.run(["go", "test", "-count=1", "-failfast", "-timeout", timeout, *selection, "./" + pkgdir], cwd=module,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            finally:
                with open(name, "wb") as fh:
                    fh.write(original)
            if build.returncode != 0:
                m["status"] = "NOT VIABLE"
            else:
                m["status"] = "KILLED" if r.returncode != 0 else "LIVED"
            m["rechecked"] = True
            tested = f" (tests {selection[1]})" if selection else ""
            print(f"  recheck {shown}:{m['line']}:{m['column']} {m['type']}: {m['status']}{tested}", file=sys.stderr)


if __name__ == "__main__":
    main()
