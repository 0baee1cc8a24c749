#!/usr/bin/env python3
"""Measures which of a package's tests run which code of the files a mutants target mutates.

For a target whose package's whole suite is too slow to run once per mutant (lease: the in-process
JetStream suite, over a minute), scripts/mutants.sh runs each mutant against only the tests that execute
the code it changes: a test that never runs a statement cannot tell a mutant of it from the original.
This builds the package's test binary with coverage, runs each top-level test alone (go test -list
finds them), and writes, for each coverage block of the mutated files that some test runs, the tests
that run it, with how long each test took:

    {"tests": {"TestX": 1.2, ...}, "blocks": [["lease.go", 39, 23, 41, 3, ["TestX", ...]], ...]}

It fails when a test fails alone: a selection built on it would leave that test's mutants untested.

    mutants_tests.py PACKAGE_DIR FILES_REGEXP OUT.json
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def main():
    pkgdir, files_re, out = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
    work = tempfile.mkdtemp(prefix="toolpool-mutants-tests-")
    binary = os.path.join(work, "pkg.test")
    subprocess.run(["go", "test", "-c", "-cover", "-covermode=set", "-o", binary, "./" + pkgdir], check=True)
    listed = subprocess.run([binary, "-test.list", "."], cwd=pkgdir, check=True, capture_output=True, text=True).stdout
    names = [n for n in listed.split() if n.startswith("Test")]
    tests, blocks = {}, {}
    for name in names:
        profile = os.path.join(work, name + ".cov")
        start = time.monotonic()
        r = subprocess.run([binary, "-test.run", "^" + name + "$", "-test.count=1", "-test.timeout=10m",
                            "-test.coverprofile=" + profile], cwd=pkgdir, capture_output=True, text=True)
        tests[name] = round(time.monotonic() - start, 2)
        if r.returncode != 0:
            sys.exit(f"mutants_tests: {name} fails alone in {pkgdir}, so no selection of tests can stand for the package:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        with open(profile) as fh:
            for line in fh:
                if line.startswith("mode:"):
                    continue
                loc, _, count = line.rsplit(" ", 2)
                if int(count) == 0:
                    continue
                path, _, span = loc.rpartition(":")
                base = os.path.basename(path)
                if not files_re.search(base):
                    continue
                begin, end = span.split(",")
                key = (base, *map(int, begin.split(".")), *map(int, end.split(".")))
                blocks.setdefault(key, []).append(name)
        print(f"  {name}: {tests[name]} s", file=sys.stderr)
    with open(out, "w") as fh:
        json.dump({"tests": tests, "blocks": [[*k, v] for k, v in sorted(blocks.items())]}, fh)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
