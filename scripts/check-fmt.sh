#!/usr/bin/env bash
set -euo pipefail
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.data/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted (run make fmt)" >&2
  exit 1
fi
