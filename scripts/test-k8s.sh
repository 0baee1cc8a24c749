#!/usr/bin/env bash
# make test-k8s: the Helm chart on a real Kubernetes control plane that this script starts on this machine,
# as a platform team would install it. Not part of make test (docs/deploy.md, "The chart on a real
# Kubernetes", has its time and what it showed).
#
#   1. binaries: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy built from
#      k8s.io/kubernetes, and CoreDNS (scripts/k8s-build.sh; cached in ~/.cache/toolpool/k8s); etcd, the CNI
#      plugins, iptables and conntrack from Debian (scripts/deps.sh k8s);
#   2. images: make images (dispatcher, worker, nats) into bin/images, and a pause image, imported into the
#      kubelet's own containerd with ctr: nothing is pulled;
#   3. a one-node cluster: etcd, the API server, controller manager, scheduler, a private containerd, the
#      kubelet (cgroupfs driver, cgroup v1 or v2), kube-proxy (iptables) and CoreDNS, on a bridge CNI
#      network, every port but DNS's chosen free at start;
#   4. the chart: the README's steps word for word (kubectl create namespace, label, ctr import, helm install
#      with deploy/helm/toolpool/ci/k8s-values.yaml), wait for Ready; calls through
#      the dispatcher's Service: an allowed call, an approval, a seeded workspace, a streamed call; a worker
#      pod killed mid-call (the call ends in exactly one final state); helm upgrade with a changed value
#      under load (no accepted call lost); helm uninstall (only what docs/deploy.md says is kept remains).
#
# Needs root, Debian 12 (or a derivative), Go, and the Go module proxy and Debian's archive the first time.
# One run at a time per machine (a lock in /run): it owns the bridge tpk8s0, the DNS address 10.244.0.1:53,
# the kubepods cgroups, the KUBE- iptables chains and /var/lib/toolpool/workspaces; at the end, passed or
# failed, it removes everything it made and fails if anything is left (and removes at the start what a
# killed earlier run left). TOOLPOOL_K8S_KEEP=1 leaves the cluster (not the release,
# which the test uninstalls) running at the end, printing its KUBECONFIG, until Ctrl-C;
# TOOLPOOL_K8S_KEEP_LOGS=1 keeps every component's log in the run's directory. TOOLPOOL_K8S_GVISOR=1 builds
# the worker image with gVisor's runsc (make images WORKER_GVISOR=1) and, with the production values, runs
# tenant globex's calls under gVisor, as those values say.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

K8S_VERSION=${K8S_VERSION:-v1.33.13}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
K8S_CACHE=${K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolpool/k8s}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
GVISOR=${TOOLPOOL_K8S_GVISOR:-0}
HELM=${HELM:-${XDG_CACHE_HOME:-$HOME/.cache}/toolpool/helm-$HELM_VERSION/helm}
GO=${GO:-go}
NS=toolpool
RELEASE=toolpool
NODE=toolpool-k8s
BRIDGE=tpk8s0
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
SERVICE_API_IP=10.96.0.1

T0=$(date +%s)
last=$T0
step() { # step MESSAGE: prints it with the time since the start and since the previous step
  local now
  now=$(date +%s)
  printf '== [%4ss +%3ss] %s\n' "$((now - T0))" "$((now - last))" "$*" >&2
  last=$now
}
die() {
  printf 'test-k8s: FAIL: %s\n' "$*" >&2
  exit 1
}
[ "$(id -u)" = 0 ] || die "run as root: the kubelet, containerd and kube-proxy need it"
[[ $GVISOR =~ ^[01]$ ]] || die "TOOLPOOL_K8S_GVISOR=$GVISOR: want 1 (runsc in the worker image, globex's calls under gVisor) or 0"

step "binaries: Kubernetes $K8S_VERSION and CoreDNS $COREDNS_VERSION (built once into $K8S_CACHE), helm, Debian's packages"
bash scripts/deps.sh k8s
K8S_VERSION=$K8S_VERSION COREDNS_VERSION=$COREDNS_VERSION K8S_CACHE=$K8S_CACHE bash scripts/k8s-build.sh
KBIN=$K8S_CACHE/$K8S_VERSION/bin
COREDNS=$K8S_CACHE/coredns-$COREDNS_VERSION/coredns
KUBECTL=$(command -v kubectl || echo "$KBIN/kubectl")
if [ ! -x "$HELM" ]; then
  mkdir -p "$(dirname "$HELM")"
  GOBIN=$(dirname "$HELM") GOFLAGS=-mod=mod $GO install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
ETCD=$(command -v etcd) || die "etcd not found: scripts/deps.sh k8s installs Debian's etcd-server"

# One run at a time per machine (the bridge, the DNS address, the kubepods cgroups and the KUBE- chains are
# the machine's): a second run stops here instead of tearing down the first one's cluster.
LOCK=/run/toolpool-k8s.lock
exec 9<>"$LOCK"
flock -n 9 || die "another make test-k8s is running on this machine (pid $(cat "$LOCK")): wait for it to finish"
echo $$ >"$LOCK"
if p=$(pgrep -x kubelet); then
  die "a kubelet already runs on this machine (pid $(echo $p)): make test-k8s needs a machine without one (it owns the kubepods cgroups and the KUBE- iptables chains)"
fi

# What the kubelet creates outside its --root-dir (the device plugins' socket, the containers' log links):
# removed at the end unless they were here before.
made_dirs=()
for d in /var/lib/kubelet /var/log/containers /var/lib/cni; do [ -e "$d" ] || made_dirs+=("$d"); done
# The README's install keeps the chart's default workspaces directory on the node: the run's calls write
# there, and it is removed at the end, so it must not hold anyone's workspaces before.
WORKSPACES=/var/lib/toolpool/workspaces
[ -e "$WORKSPACES" ] && die "$WORKSPACES exists: the chart's default workspaces directory, which the README's install uses on this node; move it away first"
[ -e /var/lib/toolpool ] || made_dirs+=(/var/lib/toolpool)
made_dirs+=("$WORKSPACES")

# clean_node PREFIX: removes from the machine what a cluster of this script leaves behind when it is not
# stopped cleanly: the pods' processes (whatever is still in the kubepods cgroups) and the shims of the
# cluster's containerd (its address starts with PREFIX) with their sockets, mounts under PREFIX (network
# namespaces included: containerd keeps them under its state directory), the kubelet's and kube-proxy's
# iptables chains (IPv4 and IPv6), the bridge plugin's masquerade rules and cached results for this network,
# the kubepods cgroups and the bridge. Idempotent. Run at the end with PREFIX $WORK/, and at the start with
# PREFIX /tmp/toolpool-k8s. for what an earlier run that was killed (SIGKILL, a reboot) left.
clean_node() {
  local prefix=$1 n p ino procs ipt t c rule chains cni f id
  for ((n = 0; n < 100; n++)); do
    # shellcheck disable=SC2046
    procs=$(cat $(find /sys/fs/cgroup -path '*/kubepods*' -name cgroup.procs 2>/dev/null) /dev/null 2>/dev/null | sort -u)
    [ -z "$procs" ] && break
    # shellcheck disable=SC2086
    kill -9 $procs 2>/dev/null
    sleep 0.1
  done
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $prefix" 2>/dev/null); do
    # The shim's socket (under /run/containerd/s, whatever containerd's state directory) outlives a killed shim.
    for ino in $(ls -l "/proc/$p/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p'); do
      awk -v i="$ino" '$7 == i && $8 ~ /^\/run\/containerd\/s\// {print $8}' /proc/net/unix
    done >"/tmp/toolpool-k8s-shim-sockets.$$"
    kill -9 "$p" 2>/dev/null
    xargs -r rm -f <"/tmp/toolpool-k8s-shim-sockets.$$"
  done
  rm -f "/tmp/toolpool-k8s-shim-sockets.$$"
  [ -n "${KBIN:-}" ] && [ -x "$KBIN/kube-proxy" ] && "$KBIN/kube-proxy" --cleanup >/dev/null 2>&1
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      # The kubelet's and kube-proxy's chains (KUBE-FIREWALL drops outside packets to 127.0.0.0/8, the
      # canaries, ...): the jumps into them from the built-in chains, then the chains.
      "$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -v '^-A KUBE-' | sed 's/^-A/-D/' |
        while read -r rule; do eval "$ipt" -t "$t" "$rule"; done
      chains=$("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p')
      for c in $chains; do "$ipt" -t "$t" -F "$c"; done
      for c in $chains; do "$ipt" -t "$t" -X "$c"; done
      # The bridge plugin's masquerade rules of a pod whose network was never torn down: they name the network.
      cni=$("$ipt" -t "$t" -S 2>/dev/null | grep -F 'name: \"toolpool-k8s\"' | grep -oE -- '-j CNI-[0-9a-f]+' | awk '{print $2}' | sort -u)
      "$ipt" -t "$t" -S 2>/dev/null | grep -F 'name: \"toolpool-k8s\"' | grep -v '^-A CNI-' | sed 's/^-A/-D/' |
        while read -r rule; do eval "$ipt" -t "$t" "$rule"; done
      for c in $cni; do "$ipt" -t "$t" -F "$c"; "$ipt" -t "$t" -X "$c"; done
    done
  done
  # containerd's CNI library caches each attachment's result in /var/lib/cni/results, whatever the config.
  for f in /var/lib/cni/results/toolpool-k8s-*; do
    [ -e "$f" ] || continue
    id=${f#/var/lib/cni/results/toolpool-k8s-}
    id=${id%%-*}
    rm -f "$f" "/var/lib/cni/results/cni-loopback-$id-lo"
  done
  find /var/log/containers -maxdepth 1 -type l -lname "$prefix*" -delete 2>/dev/null
  ip link del "$BRIDGE" 2>/dev/null
  # Unmount what the kubelet and containerd left under PREFIX, deepest first.
  awk -v w="$prefix" 'index($2, w) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  # The kubelet's cgroups (cgroupfs driver), deepest first; a cgroup is removed only once its processes are gone.
  for ((n = 0; n < 100; n++)); do
    find /sys/fs/cgroup -depth -mindepth 1 -type d -path '*/kubepods*' -exec rmdir {} + 2>/dev/null
    [ -z "$(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null)" ] && break
    sleep 0.1
  done
}

# leftovers PREFIX: what clean_node should have removed and did not, one line each.
leftovers() {
  local prefix=$1 ipt t
  pgrep -af -- "$prefix" | sed 's/^/process: /'
  # shellcheck disable=SC2046
  cat $(find /sys/fs/cgroup -path '*/kubepods*' -name cgroup.procs 2>/dev/null) /dev/null 2>/dev/null | sort -u | sed 's/^/process in the kubepods cgroups: /'
  find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null | sed 's/^/cgroup: /'
  awk -v w="$prefix" 'index($2, w) == 1 {print "mount: " $2}' /proc/self/mounts
  ip -o link show master "$BRIDGE" 2>/dev/null | awk '{print "interface: " $2}'
  ip link show "$BRIDGE" >/dev/null 2>&1 && echo "bridge: $BRIDGE"
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -S 2>/dev/null | grep -E -- '^-N KUBE-|-j KUBE-|name: \\"toolpool-k8s\\"' | sed "s/^/$ipt -t $t: /"
    done
  done
  compgen -G '/var/lib/cni/results/toolpool-k8s-*' | sed 's/^/CNI result: /'
  find /var/log/containers -maxdepth 1 -lname "$prefix*" 2>/dev/null | sed 's/^/log link: /'
}

clean_node /tmp/toolpool-k8s. || true   # || : its steps may fail (nothing to remove); set -e must not stop it
WORK=$(mktemp -d /tmp/toolpool-k8s.XXXXXX)
chmod 0755 "$WORK"
pids=()
# The kubelet sets these kernel tunables to its liking (vm.overcommit_memory=1, kernel.panic=10,
# kernel.panic_on_oops=1) and the test enables forwarding: all of them are put back at the end.
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward)
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] && SYSCTLS+=(net.bridge.bridge-nf-call-iptables)
saved_sysctls=()
for s in "${SYSCTLS[@]}"; do saved_sysctls+=("$s=$(sysctl -n "$s")"); done
# The script's own stderr, kept on fd 8: a signal can run the cleanup below inside a step whose output goes
# to a log in the run's directory, which the cleanup removes, and its report must not go there.
exec 8>&2
stop_cluster() {
  set +eu
  exec 2>&8 1>&8
  if [ -n "${KUBECONFIG:-}" ] && [ -n "${kcm_pid:-}" ]; then
    # The pods first, through the kubelet, so that their containers, mounts, network namespaces and CNI
    # rules go away cleanly: the controller manager is stopped so that nothing recreates them, then every
    # pod is deleted and the node's containerd is given a minute to have no task left.
    kill "$kcm_pid" 2>/dev/null
    timeout 120 "$KUBECTL" delete pods --all --all-namespaces --grace-period=5 --wait=true >/dev/null 2>&1
    local deadline=$(($(date +%s) + 60))
    while [ -n "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
  fi
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2>/dev/null; done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local n=0
    while kill -0 "${pids[$i]}" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    kill -9 "${pids[$i]}" 2>/dev/null
  done
  clean_node "$WORK/"
  for s in "${saved_sysctls[@]}"; do sysctl -qw "$s"; done
  for d in "${made_dirs[@]}"; do
    case $d in
      /var/lib/kubelet | /var/lib/toolpool | "$WORKSPACES") rm -rf "$d" ;; # only the kubelet, only this run
      *) find "$d" -depth -type d -empty -delete 2>/dev/null ;; # others may have put something there meanwhile
    esac
  done
  local left s
  left=$(leftovers "$WORK/")
  for s in "${saved_sysctls[@]}"; do [ "$(sysctl -n "${s%%=*}")" = "${s#*=}" ] || left+=$'\n'"sysctl: ${s%%=*} is $(sysctl -n "${s%%=*}"), was ${s#*=}"; done
  for d in "${made_dirs[@]}"; do [ -e "$d" ] && left+=$'\n'"directory: $d"; done
  if [ -n "${TOOLPOOL_K8S_KEEP_LOGS:-}" ]; then
    echo "test-k8s: logs kept in $WORK/logs" >&2
  else
    rm -rf "$WORK"
  fi
  left=$(sed '/^$/d' <<<"$left")
  if [ -n "$left" ]; then
    printf 'test-k8s: FAIL: the cleanup left this on the machine:\n%s\n' "$left" >&2
    exit 1
  fi
  echo "test-k8s: nothing left on the machine (processes, mounts, interfaces, iptables rules, cgroups, sysctls)" >&2
}
trap stop_cluster EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS WHAT COMMAND...: polls COMMAND every half second until it succeeds
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$what: not within ${secs}s"
    sleep 0.5
  done
}
start() { # start NAME COMMAND...: runs it in the background, its output in logs/NAME.log
  local name=$1
  shift
  "$@" >"$WORK/logs/$name.log" 2>&1 9>&- &
  pids+=($!)
}
mkdir -p "$WORK/logs" "$WORK/pki" "$WORK/cni" "$WORK/pv"
HOST_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[ -n "$HOST_IP" ] || HOST_IP=$(hostname -I | awk '{print $1}')
[ -n "$HOST_IP" ] || die "no IPv4 address on this machine for the node"

# --- PKI -----------------------------------------------------------------------------------------------------
step "PKI: a CA, the API server's certificate, one admin client certificate, the service account key"
pki=$WORK/pki
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=toolpool-k8s-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() { # cert NAME SUBJECT [SAN]
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  local ext=$pki/$1.ext
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [ -n "${3:-}" ] && echo "subjectAltName=$3" >>"$ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
}
cert apiserver /CN=kube-apiserver "IP:127.0.0.1,IP:$HOST_IP,IP:$SERVICE_API_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
# One identity in system:masters for every component and for the test: a one-node test cluster, not a
# model of a production cluster's identities.
cert admin "/O=system:masters/CN=admin"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

# --- etcd and the control plane ---------------------------------------------------------------------------
ETCD_PORT=$(free_port)
ETCD_PEER=$(free_port)
API_PORT=$(free_port)
step "etcd $("$ETCD" --version | head -1 | awk '{print $3}') on 127.0.0.1:$ETCD_PORT"
start etcd "$ETCD" --name default --data-dir "$WORK/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER" --unsafe-no-fsync
wait_for 30 "etcd healthy" curl -sf "http://127.0.0.1:$ETCD_PORT/health"

step "kube-apiserver on $HOST_IP:$API_PORT"
start kube-apiserver "$KBIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 0.0.0.0 --advertise-address "$HOST_IP" --secure-port "$API_PORT" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
  --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
  --kubelet-preferred-address-types InternalIP \
  --service-account-issuer https://kubernetes.default.svc.cluster.local --service-account-key-file "$pki/sa.pub" \
  --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
  --authorization-mode Node,RBAC --allow-privileged=true --profiling=false --v=1

KUBECONFIG=$WORK/admin.kubeconfig
export KUBECONFIG
"$KUBECTL" config set-cluster k --server "https://127.0.0.1:$API_PORT" --certificate-authority "$pki/ca.crt" --embed-certs >/dev/null
"$KUBECTL" config set-credentials admin --client-certificate "$pki/admin.crt" --client-key "$pki/admin.key" --embed-certs >/dev/null
"$KUBECTL" config set-context k --cluster k --user admin >/dev/null
"$KUBECTL" config use-context k >/dev/null
wait_for 120 "kube-apiserver ready" "$KUBECTL" get --raw /readyz

step "kube-controller-manager and kube-scheduler"
start kube-controller-manager "$KBIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" \
  --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" --use-service-account-credentials \
  --service-cluster-ip-range "$SERVICE_CIDR" --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)" --v=1
kcm_pid=${pids[-1]}
start kube-scheduler "$KBIN/kube-scheduler" --kubeconfig "$KUBECONFIG" \
  --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)" --v=1

# --- the node: containerd, CNI, kubelet, kube-proxy, CoreDNS -------------------------------------------------
step "the node's containerd ($(containerd --version | awk '{print $3}')), and make images (built twice, compared) into bin/images"
CTRD=$WORK/containerd
mkdir -p "$CTRD"
# The kubelet asks for negative oom_score_adj values (-998 for a pod's sandbox), which only a process with
# CAP_SYS_RESOURCE may set: on a machine whose root lacks it (some CI sandboxes), runc fails every pod with
# "failed to update /proc/self/oom_score_adj: Permission denied". There, containerd clamps the values to its
# own (restrict_oom_score_adj), as it does for rootless Kubernetes.
restrict_oom=false
if (( ((0x$(sed -n "s/^CapEff:[[:space:]]*//p" /proc/self/status) >> 24) & 1) == 0 )); then
  restrict_oom=true
  echo "   no CAP_SYS_RESOURCE here: containerd's restrict_oom_score_adj is on (pods keep oom_score_adj >= 0)" >&2
fi
cat >"$CTRD/config.toml" <<TOML
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$CTRD/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "toolpool.local/pause:dev"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # The pods' network namespaces and runc's state live under the run's directory, not in /run/netns and
  # /run/containerd/runc, so that whatever a crash leaves is removed with it.
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = $restrict_oom
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$WORK/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$CTRD/runc"
TOML
start containerd containerd --config "$CTRD/config.toml"
wait_for 30 "containerd socket" test -S "$CTRD/containerd.sock"
CTR=(ctr --address "$CTRD/containerd.sock" -n k8s.io)

# make images, into bin/images as the chart's README has it; --check builds every image twice and fails
# unless both builds are identical: the images the cluster runs are reproducible ones. The README's own
# ctr import loop loads them below, at the install.
IMAGES=bin/images
WORKER_GVISOR=$GVISOR IMAGES_OUT=$IMAGES bash scripts/images.sh --check >"$WORK/logs/images.log" 2>&1 || { cat "$WORK/logs/images.log" >&2; die "make images failed"; }
grep -E "^images: .*($IMAGES/|reproducible)" "$WORK/logs/images.log" | sed 's/^/   /' >&2
mkdir -p "$WORK/pause-root/usr/local/bin"
CGO_ENABLED=0 $GO -C deploy/images build -trimpath -ldflags "-s -w" -o "$WORK/pause-root/usr/local/bin/pause" ./pause
$GO -C deploy/images build -o "$WORK/images-tool" .
"$WORK/images-tool" -name toolpool.local/pause:dev -o "$WORK/pause.oci.tar" -layer "$WORK/pause-root" \
  -user 65535:65535 -entrypoint /usr/local/bin/pause >/dev/null
"${CTR[@]}" images import "$WORK/pause.oci.tar" >/dev/null || die "ctr import pause failed"

step "CNI: bridge $BRIDGE, pods in $POD_CIDR"
ip link add "$BRIDGE" type bridge 2>/dev/null || true
ip addr replace "$GATEWAY/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
sysctl -qw net.ipv4.ip_forward=1
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] && sysctl -qw net.bridge.bridge-nf-call-iptables=1
cat >"$WORK/cni/10-toolpool.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "toolpool-k8s", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$WORK/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
JSON

step "CoreDNS on $GATEWAY:53 (the kubelet's clusterDNS)"
cat >"$WORK/Corefile" <<COREFILE
.:53 {
    bind $GATEWAY
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG k
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 5
}
COREFILE
start coredns "$COREDNS" -conf "$WORK/Corefile"

step "kubelet $K8S_VERSION (node $NODE, $(stat -fc %T /sys/fs/cgroup | sed 's/tmpfs/cgroup v1/; s/cgroup2fs/cgroup v2/'))"
KUBELET_PORT=$(free_port)
cat >"$WORK/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CTRD/containerd.sock
clusterDNS: [$GATEWAY]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $WORK/pod-logs
# A shared test machine: never evict for its disk or memory, never collect the imported images.
evictionHard: {memory.available: "1Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
YAML
start kubelet "$KBIN/kubelet" --config "$WORK/kubelet.yaml" --kubeconfig "$KUBECONFIG" --root-dir "$WORK/kubelet" \
  --cert-dir "$WORK/kubelet-pki" --hostname-override "$NODE" --node-ip "$HOST_IP" --v=1
wait_for 120 "node $NODE Ready" bash -c "'$KUBECTL' get node '$NODE' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

step "kube-proxy (iptables, masquerade all service traffic)"
start kube-proxy "$KBIN/kube-proxy" --kubeconfig "$KUBECONFIG" --hostname-override "$NODE" --proxy-mode iptables \
  --cluster-cidr "$POD_CIDR" --masquerade-all --conntrack-max-per-core 0 \
  --healthz-bind-address "127.0.0.1:$(free_port)" --metrics-bind-address "127.0.0.1:$(free_port)" --v=1
wait_for 60 "kube-proxy's rules for the kubernetes Service" bash -c "iptables -t nat -S KUBE-SERVICES | grep -q '$SERVICE_API_IP/32'"
wait_for 60 "CoreDNS answers" bash -c "python3 - <<'PY'
import socket, struct
q = struct.pack('>HHHHHH', 1, 0x100, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in 'kubernetes.default.svc.cluster.local'.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(q, ('$GATEWAY', 53))
r = s.recv(512); assert struct.unpack('>H', r[6:8])[0] >= 1, 'no answer'
PY"
step "cluster up: $("$KUBECTL" version -o json | jq -r .serverVersion.gitVersion), node $NODE Ready"

# --- the chart ---------------------------------------------------------------------------------------------
# The built-in NATS asks for three 1 GiB ReadWriteOnce claims; a bare cluster has no provisioner, so the
# test makes three hostPath volumes for them, of a class that binds when a pod is scheduled
# (WaitForFirstConsumer, as local volumes should: with immediate binding the scheduler saw a claim still
# unbound and left its pod Pending for minutes). hostPath volumes get no fsGroup ownership: they are made
# owned by the NATS user (1000), as a provisioner that honours fsGroup would leave them.
# The class is the cluster's default, as a real cluster's is: the chart's values name none.
step "three hostPath PersistentVolumes of the default class toolpool-k8s-local for the built-in NATS's claims"
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: toolpool-k8s-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
YAML
for i in 0 1 2; do
  install -d -o 1000 -g 1000 -m 0770 "$WORK/pv/nats-$i"
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: toolpool-k8s-nats-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: toolpool-k8s-local
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $WORK/pv/nats-$i, type: Directory}
YAML
done

VALUES=deploy/helm/toolpool/ci/k8s-values.yaml
# The chart's README steps, word for word: each line must be in deploy/helm/toolpool/README.md as it is here,
# and runs as a user would type it (kubectl, helm and ctr on PATH; ctr reaches the node's containerd through
# CONTAINERD_ADDRESS). Only `sudo make images` is not repeated: the images were built above, into the same
# bin/images.
README_STEPS=(
  'kubectl create namespace toolpool'
  'kubectl label namespace toolpool pod-security.kubernetes.io/enforce=privileged   # the workers run containers'
  'for n in dispatcher worker nats; do ctr -n k8s.io images import bin/images/$n.oci.tar; done   # on every node'
  'helm install toolpool deploy/helm/toolpool -n toolpool -f deploy/helm/toolpool/ci/k8s-values.yaml'
)
step "the chart's README steps, as written: kubectl create namespace, label, ctr import, helm install; then every pod Ready"
for line in "${README_STEPS[@]}"; do
  grep -qxF -- "$line" deploy/helm/toolpool/README.md || die "deploy/helm/toolpool/README.md no longer has the line this test runs: $line"
done
USER_PATH=$(dirname "$HELM"):$(dirname "$KUBECTL"):$PATH
for line in "${README_STEPS[@]}"; do
  echo "   \$ $line" >&2
  (export PATH=$USER_PATH CONTAINERD_ADDRESS=$CTRD/containerd.sock && eval "$line") >>"$WORK/logs/helm-install.log" 2>&1 ||
    { cat "$WORK/logs/helm-install.log" >&2; die "the README's step failed: $line"; }
done
"${CTR[@]}" images ls -q | grep -q toolpool.local/worker:dev || die "the README's ctr import left no worker image in the node's containerd"
# What helm install --wait would do: every workload of the release rolled out.
ready() {
  "$KUBECTL" -n "$NS" rollout status "statefulset/$RELEASE-nats" --timeout 10m &&
    "$KUBECTL" -n "$NS" rollout status "deployment/$RELEASE-dispatcher" --timeout 5m &&
    "$KUBECTL" -n "$NS" rollout status "daemonset/$RELEASE-worker" --timeout 5m
}
if ! ready >>"$WORK/logs/helm-install.log" 2>&1; then
  cat "$WORK/logs/helm-install.log" >&2
  "$KUBECTL" -n "$NS" get pods -o wide >&2
  "$KUBECTL" -n "$NS" describe pods >&2 | tail -80
  for p in $("$KUBECTL" -n "$NS" get pods -o name); do echo "--- $p" >&2; "$KUBECTL" -n "$NS" logs "$p" --all-containers --tail 30 >&2; done
  die "helm install did not become Ready"
fi
"$KUBECTL" -n "$NS" get pods -o wide >&2

TOKEN=$("$KUBECTL" -n "$NS" get secret "$RELEASE-bootstrap-token" -o jsonpath='{.data.token}' | base64 -d)
[ -n "$TOKEN" ] || die "the bootstrap token Secret $RELEASE-bootstrap-token is empty"
SVC_IP=$("$KUBECTL" -n "$NS" get svc "$RELEASE-dispatcher" -o jsonpath='{.spec.clusterIP}')
API=http://$SVC_IP:8080

api() { curl -sS --max-time "${TIMEOUT:-120}" -H "Authorization: Bearer $TOKEN" "$@"; }
call() { # call JSON: POST /v1/calls through the Service, prints the envelope
  api -X POST "$API/v1/calls" -H 'Content-Type: application/json' -d "$1"
}
field() { jq -r "$1" <<<"$2"; }
final() { case $1 in queued | pending_approval | running | unknown | "" | null) return 1 ;; esac; }
expect() { # expect WHAT JQ-CONDITION ENVELOPE
  jq -e "$2" >/dev/null <<<"$3" || die "$1: want $2, got: $3"
  echo "   $1: ok" >&2
}

step "an allowed call, through kubectl port-forward svc/$RELEASE-dispatcher (the chart's README)"
PF_PORT=$(free_port)
"$KUBECTL" -n "$NS" port-forward "svc/$RELEASE-dispatcher" "$PF_PORT:8080" >"$WORK/logs/port-forward.log" 2>&1 9>&- &
pf=$!
pids+=($pf)
wait_for 30 "port-forward listening" curl -s "http://127.0.0.1:$PF_PORT/healthz"
r=$(curl -sS --max-time 120 -X POST "http://127.0.0.1:$PF_PORT/v1/calls" -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' -d '{"tool":"run_shell","args":{"command":"echo hi; id -un"},"workspace":"ws1"}')
expect "echo hi through port-forward" '.status == "ok" and .exit_code == 0 and .stdout == "hi\nsandbox\n"' "$r"
kill "$pf" 2>/dev/null || true

step "an allowed call through the Service's ClusterIP $SVC_IP (kube-proxy)"
r=$(call '{"tool":"run_shell","args":{"command":"echo hi; uname -s"},"workspace":"ws1"}')
expect "echo hi through the ClusterIP" '.status == "ok" and .stdout == "hi\nLinux\n"' "$r"

step "an approval: touch (not a read-only command) waits for a person"
r=$(call '{"tool":"run_shell","args":{"command":"touch approved.txt && ls"},"workspace":"ws1","wait":false}')
id=$(field .id "$r")
[ -n "$id" ] && [ "$id" != null ] || die "approval: no call id in $r"
wait_for 30 "the call listed in GET /v1/approvals" bash -c "curl -sS -H 'Authorization: Bearer $TOKEN' '$API/v1/approvals' | grep -q '$id'"
r=$(api "$API/v1/calls/$id")
expect "parked before approval" '.status == "pending_approval"' "$r"
api -X POST "$API/v1/approvals/$id" -H 'Content-Type: application/json' -d '{"decision":"approve"}' >/dev/null
r=$(api "$API/v1/calls/$id?wait=60s")
expect "approved, then run" '.status == "ok" and (.stdout | contains("approved.txt"))' "$r"

step "a seeded workspace: PUT /v1/workspaces/seeded with a tar.gz, then a call reads it"
mkdir -p "$WORK/seed"
echo "seeded through the Service" >"$WORK/seed/hello.txt"
tar -C "$WORK/seed" -czf "$WORK/seed.tgz" hello.txt
r=$(api -X PUT "$API/v1/workspaces/seeded" --data-binary "@$WORK/seed.tgz")
expect "workspace created" '.workspace != null' "$r"
r=$(call '{"tool":"run_shell","args":{"command":"cat hello.txt"},"workspace":"seeded"}')
expect "the seeded file in the call" '.status == "ok" and .stdout == "seeded through the Service\n"' "$r"

step "streaming: POST /v1/calls with Accept: text/event-stream, output as printed"
# Each line of the stream, prefixed with the seconds since the request.
curl -sS -N --max-time 120 -X POST "$API/v1/calls" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -H 'Accept: text/event-stream' -d '{"tool":"run_shell","args":{"command":"echo line1; sleep 2; echo line2; sleep 2; echo line3"},"workspace":"ws1"}' |
  python3 -c '
import sys, time
t0 = time.time()
for line in sys.stdin:
    print("%.2f %s" % (time.time() - t0, line.rstrip("\n")), flush=True)' >"$WORK/stream.txt"
line1_at=$(awk '/line1/ {print $1; exit}' "$WORK/stream.txt")
line3_at=$(awk '/line3/ {print $1; exit}' "$WORK/stream.txt")
[ -n "$line1_at" ] && [ -n "$line3_at" ] || { cat "$WORK/stream.txt" >&2; die "streaming: line1 or line3 missing from the stream"; }
python3 -c "import sys; sys.exit(0 if $line3_at - $line1_at >= 3 else 1)" || { cat "$WORK/stream.txt" >&2; die "streaming: line1 came at ${line1_at}s and line3 at ${line3_at}s: not as printed"; }
grep -q '"status":"ok"' "$WORK/stream.txt" || { cat "$WORK/stream.txt" >&2; die "streaming: no final result in the stream"; }
echo "   line1 at ${line1_at}s, line3 at ${line3_at}s, then the result: ok" >&2

# await ID...: every call reaches a final state; prints "ID STATUS" lines.
await() {
  local id r s
  for id in "$@"; do
    r=$(TIMEOUT=400 api "$API/v1/calls/$id?wait=300s")
    s=$(field .status "$r")
    final "$s" || die "call $id: no final state after 300s: $r"
    echo "$id $s"
  done
}

step "a worker pod killed mid-call (SIGKILL, no drain): the call ends in exactly one final state"
r=$(call '{"tool":"run_shell","args":{"command":"echo started; sleep 20; echo finished"},"workspace":"ws1","wait":false,"timeout_ms":120000}')
id=$(field .id "$r")
wait_for 60 "call $id running" bash -c "curl -sS -H 'Authorization: Bearer $TOKEN' '$API/v1/calls/$id' | jq -e '.status == \"running\"'"
worker_pod=$("$KUBECTL" -n "$NS" get pods -l app.kubernetes.io/component=worker -o jsonpath='{.items[0].metadata.name}')
"$KUBECTL" -n "$NS" delete pod "$worker_pod" --grace-period=0 --force >/dev/null 2>&1
echo "   killed $worker_pod while $id ran" >&2
wait_for 300 "a new worker Ready" bash -c "'$KUBECTL' -n '$NS' get pods -l app.kubernetes.io/component=worker -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready}{\"\\n\"}{end}' | grep -v '^$worker_pod ' | grep -q ' true$'"
await "$id" >"$WORK/kill-result.txt"
read -r _ status <"$WORK/kill-result.txt"
r=$(api "$API/v1/calls/$id")
echo "   $id: $(jq -c '{status, exit_code, stdout, error, worker}' <<<"$r")" >&2
# Exactly one final state: the record does not change again, and the audit log has one outcome for it.
sleep 1
r2=$(api "$API/v1/calls/$id")
[ "$(field .status "$r2")" = "$status" ] || die "call $id changed its final state: $status, then $(field .status "$r2")"
outcomes=$(api "$API/v1/audit?since=1h" | jq -s --arg id "$id" '[.[] | .. | objects | select(.call_id? == $id and .event? == "finished")] | length')
echo "   audit log: $outcomes \"finished\" event(s) for $id" >&2
[ "$outcomes" = 1 ] || die "call $id has $outcomes finished events in the audit log, want exactly one"

step "helm upgrade with a changed value (worker.slots 4 -> 3, dispatcher.logLevel debug) under load: no accepted call lost"
accepted=()
load() { # submits a call every 0.5s until the file $WORK/stop-load exists; prints the accepted ids
  local r id
  while [ ! -e "$WORK/stop-load" ]; do
    if r=$(curl -sS --max-time 10 -X POST "$API/v1/calls" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
      -d '{"tool":"run_shell","args":{"command":"sleep 2; echo upgraded"},"workspace":"ws1","wait":false}' 2>/dev/null); then
      id=$(jq -r '.id // empty' <<<"$r" 2>/dev/null || true)
      if [ -n "$id" ]; then echo "$id"; else echo "refused: $r" >&2; fi
    fi
    sleep 0.5
  done
}
load >"$WORK/accepted.txt" 2>"$WORK/logs/load.log" &
loader=$!
pids+=($loader)
sleep 3
# pods_of COMPONENT: the uids of its pods that are not terminating.
pods_of() { "$KUBECTL" -n "$NS" get pods -l "app.kubernetes.io/component=$1" -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null) | .metadata.uid' | sort; }
before=$( { pods_of dispatcher; pods_of worker; } | sort)
ustart=$(date +%s)
"$HELM" upgrade "$RELEASE" deploy/helm/toolpool -n "$NS" -f "$VALUES" \
  --set worker.slots=3 --set dispatcher.logLevel=debug --wait --timeout 10m >"$WORK/logs/helm-upgrade.log" 2>&1 \
  || { cat "$WORK/logs/helm-upgrade.log" >&2; die "helm upgrade failed"; }
"$KUBECTL" -n "$NS" rollout status deployment/"$RELEASE-dispatcher" --timeout 5m >/dev/null
"$KUBECTL" -n "$NS" rollout status daemonset/"$RELEASE-worker" --timeout 5m >/dev/null
uend=$(date +%s)
after=$( { pods_of dispatcher; pods_of worker; } | sort)
kept=$(comm -12 <(echo "$before") <(echo "$after"))
[ -z "$kept" ] || die "helm upgrade left pods in place (uids $kept): the changed configs did not roll them: $("$KUBECTL" -n "$NS" get pods -o wide)"
sleep 3
touch "$WORK/stop-load"
wait "$loader" || true
mapfile -t accepted <"$WORK/accepted.txt"
[ ${#accepted[@]} -ge 5 ] || die "only ${#accepted[@]} calls accepted during the upgrade (refusals: $(grep -c . "$WORK/logs/load.log" || true))"
await "${accepted[@]}" >"$WORK/upgrade-results.txt"
ok=$(grep -c ' ok$' "$WORK/upgrade-results.txt" || true)
echo "   upgrade took $((uend - ustart))s, every dispatcher and worker pod replaced; ${#accepted[@]} calls accepted meanwhile, every one final: $ok ok, $(awk '$2 != "ok"' "$WORK/upgrade-results.txt" | awk '{print $2}' | sort | uniq -c | tr '\n' ' ')" >&2
echo "   refused or failed to connect during the upgrade: $(grep -c . "$WORK/logs/load.log" || true)" >&2
[ "$ok" = ${#accepted[@]} ] || die "calls accepted during the upgrade did not all succeed: $(awk '$2 != "ok"' "$WORK/upgrade-results.txt" | head -5)"
slots=$("$KUBECTL" -n "$NS" get configmap "$RELEASE-worker" -o jsonpath='{.data.config\.yaml}' | sed -n 's/^slots: *//p')
[ "$slots" = 3 ] || die "the worker's config after the upgrade says slots $slots, want 3"

step "helm uninstall: only what docs/deploy.md says is kept remains"
"$HELM" uninstall "$RELEASE" -n "$NS" --wait --timeout 5m >"$WORK/logs/helm-uninstall.log" 2>&1 \
  || { cat "$WORK/logs/helm-uninstall.log" >&2; die "helm uninstall failed"; }
wait_for 300 "every pod of the release gone" bash -c "[ -z \"\$('$KUBECTL' -n '$NS' get pods -o name)\" ]"
left=$("$KUBECTL" -n "$NS" get "$("$KUBECTL" api-resources --namespaced --verbs list -o name | grep -v '^events' | paste -sd, -)" \
  -o jsonpath='{range .items[*]}{.kind}/{.metadata.name}{"\n"}{end}' 2>/dev/null | sort -u |
  grep -vx 'ConfigMap/kube-root-ca.crt' | grep -vx 'ServiceAccount/default' || true)
echo "$left" | sed 's/^/   left: /' >&2
want=$(printf 'PersistentVolumeClaim/data-%s-nats-%s\n' "$RELEASE" 0 "$RELEASE" 1 "$RELEASE" 2; echo "Secret/$RELEASE-bootstrap-token")
[ "$left" = "$(sort <<<"$want")" ] || die "after helm uninstall, want only the NATS claims and the bootstrap token Secret (docs/deploy.md), got: $left"

# --- once more, with the production shape ------------------------------------------------------------------
# ci/production-values.yaml as far as one node allows; $WORK/one-node.yaml says what is changed, and why.
step "production shape: helm install with ci/production-values.yaml and the one-node changes"
"$KUBECTL" label node "$NODE" toolpool.io/sandbox=true >/dev/null
"$KUBECTL" create namespace monitoring >/dev/null   # the Grafana dashboard's ConfigMap goes there
"$KUBECTL" -n "$NS" create secret tls toolpool-tls --cert "$pki/apiserver.crt" --key "$pki/apiserver.key" >/dev/null
"$KUBECTL" -n "$NS" create secret generic toolpool-registry --from-literal password=unused >/dev/null
# The shared workspaces claim (ReadWriteMany, class efs-sc): a hostPath volume of that class stands in for EFS.
install -d -m 0755 "$WORK/pv/workspaces"
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: efs-sc}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: toolpool-k8s-workspaces}
spec:
  capacity: {storage: 1Ti}
  accessModes: [ReadWriteMany]
  storageClassName: efs-sc
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $WORK/pv/workspaces, type: Directory}
YAML
cat >"$WORK/one-node.yaml" <<'YAML'
# What one 2-core node without registries, Prometheus Operator or gVisor in the image cannot take:
dispatcher:
  image: {repository: toolpool.local/dispatcher, tag: dev, pullPolicy: Never}
  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 1Gi}}      # 3 x 250m does not fit
worker:
  image: {repository: toolpool.local/worker, tag: dev, pullPolicy: Never}
  resources: {requests: {cpu: 200m, memory: 256Mi}, limits: {memory: 4Gi}}    # 2 CPUs, 4 GiB do not fit
  images: {pinned: [], registries: []}   # registry.example.com does not exist
YAML
# Without TOOLPOOL_K8S_GVISOR=1 the worker image has no runsc: gVisor is never offered, and globex (whose
# calls must run under it) is not called.
[ "$GVISOR" = 1 ] || echo "  gvisor: {disabled: true}" >>"$WORK/one-node.yaml"
cat >>"$WORK/one-node.yaml" <<'YAML'
  drainTimeoutSeconds: 60
jetstream:
  builtin:
    image: {repository: toolpool.local/nats, tag: dev, pullPolicy: Never}
    resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 1Gi}}
metrics:
  serviceMonitor: {enabled: false}       # no Prometheus Operator CRDs here
  prometheusRule: {enabled: false}
YAML
if ! "$HELM" install "$RELEASE" deploy/helm/toolpool -n "$NS" -f deploy/helm/toolpool/ci/production-values.yaml \
  -f "$WORK/one-node.yaml" --wait --timeout 10m >"$WORK/logs/helm-install-production.log" 2>&1; then
  cat "$WORK/logs/helm-install-production.log" >&2
  "$KUBECTL" -n "$NS" get pods,pvc -o wide >&2
  "$KUBECTL" -n "$NS" get events --field-selector type=Warning >&2
  die "helm install with the production values did not become Ready"
fi
"$KUBECTL" -n "$NS" get pods -o wide >&2
# Tenant acme's approver token is "test" (its sha256 is in the values). The Service is a new one.
TOKEN=test
API=http://$("$KUBECTL" -n "$NS" get svc "$RELEASE-dispatcher" -o jsonpath='{.spec.clusterIP}'):8080
# The production policy allows only its read-only list; everything else of kind execute asks.
r=$(call '{"tool":"run_shell","args":{"command":"ls -d /workspace"},"workspace":"prod"}')
expect "acme's ls (on the allow list) through the ClusterIP" '.status == "ok" and .stdout == "/workspace\n"' "$r"
r=$(call '{"tool":"run_shell","args":{"command":"echo hi"},"workspace":"prod","wait":false}')
id=$(field .id "$r")
expect "acme's echo (on no list) waits for approval" '.status == "pending_approval"' "$(api "$API/v1/calls/$id")"
api -X POST "$API/v1/approvals/$id" -H 'Content-Type: application/json' -d '{"decision":"approve"}' >/dev/null
await "$id" >/dev/null
expect "approved, then run, on the shared workspaces claim" '.status == "ok" and .stdout == "hi\n"' "$(api "$API/v1/calls/$id")"
if [ "$GVISOR" = 1 ]; then
  # globex's calls run only under gVisor (tenants[].runtime): a worker without it answers runtime_unavailable.
  # Its token is "bar" (its sha256 is in the values).
  r=$(TOKEN=bar call '{"tool":"run_shell","args":{"command":"ls -d /workspace"},"workspace":"globex"}')
  expect "globex's ls, under gVisor (runsc in the worker image)" '.status == "ok" and .stdout == "/workspace\n"' "$r"
fi
"$HELM" uninstall "$RELEASE" -n "$NS" --wait --timeout 5m >"$WORK/logs/helm-uninstall-production.log" 2>&1 \
  || { cat "$WORK/logs/helm-uninstall-production.log" >&2; die "helm uninstall (production values) failed"; }
"$KUBECTL" -n monitoring get configmaps -o name | grep -q dashboard && die "the Grafana dashboard ConfigMap outlived helm uninstall"
"$KUBECTL" -n "$NS" get pvc "$RELEASE-workspaces" >/dev/null 2>&1 || die "the workspaces claim was deleted by helm uninstall; docs/deploy.md says it is kept"
echo "   uninstalled; the workspaces claim $RELEASE-workspaces is kept, as documented" >&2

step "PASS: make test-k8s in $(( $(date +%s) - T0 ))s"
if [ -n "${TOOLPOOL_K8S_KEEP:-}" ]; then
  echo "test-k8s: the cluster keeps running (TOOLPOOL_K8S_KEEP): export KUBECONFIG=$KUBECONFIG; Ctrl-C stops it" >&2
  wait
fi
