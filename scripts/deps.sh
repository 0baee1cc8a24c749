#!/usr/bin/env bash
# Installs what is missing from Debian's packages, in three sets:
#
#   scripts/deps.sh        what make run needs: containerd, runc, crun (the faster OCI runtime the worker can
#                          run through the runc shim), and git and curl for calls on the host's /usr
#   scripts/deps.sh test   and what make test needs: ctr (the fault tests list containers with it), promtool,
#                          Node.js with npm for test/mcp, python3-pip for the egress tests, strace for the policy
#                          oracle, python3-pytest for the Python client's suite (test/clients), Debian's
#                          chromium and chromium-driver for the web console's browser tests (test/console drives
#                          chromium itself; no browser is downloaded); and, from the Go module proxy,
#                          versitygw, the S3 server the checkpoint tests run
#   scripts/deps.sh k8s    and what make test-k8s needs: etcd (etcd-server), the CNI plugins
#                          (containernetworking-plugins), iptables and conntrack for kube-proxy
set -euo pipefail
missing=()
mode=${1:-run}
case $mode in
  run | test | k8s) ;;
  *)
    echo "deps.sh: unknown argument $1: scripts/deps.sh [test|k8s]" >&2
    exit 1
    ;;
esac
if [ "$mode" = k8s ]; then
  command -v etcd >/dev/null || missing+=(etcd-server)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/portmap ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
fi
command -v containerd >/dev/null || missing+=(containerd)
command -v containerd-shim-runc-v2 >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
command -v crun >/dev/null || missing+=(crun)
command -v curl >/dev/null || missing+=(curl)
[ -x /usr/bin/git ] && [ -x /usr/lib/git-core/git-http-backend ] || missing+=(git)
check_node() { :; }
if [ "$mode" != run ]; then
  command -v ctr >/dev/null || missing+=(containerd) # the fault tests list containers with it
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  # test/clients runs the Python client's suite (clients/python) with Debian's python3 and pytest.
  /usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || missing+=(python3-pytest)
  command -v promtool >/dev/null || missing+=(prometheus) # promtool checks the metrics and alert rules
  command -v strace >/dev/null || missing+=(strace)       # the policy oracle traces shells in the sandbox
  [ -x /usr/bin/chromium ] || missing+=(chromium)          # test/console: the web console in a real browser
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
  # test/mcp drives the dispatcher with the official MCP TypeScript SDK clients, which need Node.js 20 (the
  # 2.x client). Debian 13's nodejs is 20; Debian 12's is 18, which test/mcp refuses, saying so.
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  check_node() {
    local major
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$major" -lt 20 ]; then
      echo "warning: Node.js $major is too old for test/mcp, which needs 20 or later (Debian 13's nodejs, or nodejs.org)" >&2
    fi
  }
  # The S3 checkpoint store is tested against a real S3 server: versitygw (its posix backend), built from
  # the Go module proxy (about a minute) when it is missing or another version.
  versitygw_version=v1.8.0
  if ! { command -v versitygw >/dev/null && go version -m "$(command -v versitygw)" 2>/dev/null | grep -q "github.com/versity/versitygw[[:space:]]*$versitygw_version"; }; then
    echo "building versitygw $versitygw_version (the S3 server of the checkpoint tests)..." >&2
    GOBIN=/usr/local/bin GOFLAGS= go install "github.com/versity/versitygw/cmd/versitygw@$versitygw_version"
  fi
fi
if [ ${#missing[@]} -eq 0 ]; then
  check_node
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "toolpool needs ${missing[*]}: run as root, or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} from Debian's packages..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" ca-certificates >/dev/null
# Only promtool is wanted from the prometheus package: do not leave its server running on a systemd host.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
fi
# The containerd package's own service is not used: toolpool's worker runs a private containerd.
containerd --version >&2
runc --version | head -1 >&2
crun --version | head -1 >&2
check_node
