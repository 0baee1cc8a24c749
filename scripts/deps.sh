#!/usr/bin/env bash
# Installs containerd and runc from Debian's packages when they are missing.
set -euo pipefail
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v containerd-shim-runc-v2 >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "toolpool needs ${missing[*]}: run as root, or install them: apt-get install containerd runc" >&2
  exit 1
fi
echo "installing containerd and runc from Debian's packages..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends containerd runc curl ca-certificates >/dev/null
# The package's own containerd service is not ours: toolpool's worker runs a private one.
containerd --version >&2
runc --version | head -1 >&2
