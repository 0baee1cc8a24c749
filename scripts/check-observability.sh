#!/usr/bin/env bash
# Checks the Prometheus alert rules (promtool check rules) and runs their unit tests (promtool test rules).
# promtool comes with Debian's prometheus package: apt-get install prometheus.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null 2>&1; then
  echo "check-observability: promtool is missing; install it with 'apt-get install prometheus' (Debian's package provides /usr/bin/promtool)" >&2
  exit 1
fi
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml
