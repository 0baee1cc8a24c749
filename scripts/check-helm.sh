#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/toolpool and the Dockerfiles offline:
#   0. the Dockerfiles parse with BuildKit's parser and pass its instruction checks and ours (deploy/docker/lint);
#      the image builder of make images (deploy/images) passes its tests;
#   1. the chart's copies of the alert rules and the dashboard match deploy/prometheus and deploy/grafana;
#   2. the validator's own tests (it must catch a misspelt field, a wrong type, a dangling reference, ...);
#   3. helm lint --strict and helm template for the default values and every ci/*.yaml values file;
#   4. every rendered object decoded strictly into its Kubernetes (or Prometheus Operator) API type and
#      checked against the others (deploy/helm/validate);
#   5. the rendered dispatcher and worker config files, and the policy, accepted by the real binaries;
#   6. the umbrella chart deploy/helm/toolpool-stack rendered with toolpool inside it;
#   7. that bad input fails: a bad value (schema), a bad combination (template), a misspelt field in a
#      template (validator).
#
#   scripts/check-helm.sh          run the checks
#   scripts/check-helm.sh --sync   copy deploy/prometheus/alerts.yaml and deploy/grafana/toolpool.json into
#                                  the chart first
#
# helm comes from the Go module proxy (no other download works here): built once into
# ${XDG_CACHE_HOME:-$HOME/.cache}/toolpool/helm-$HELM_VERSION and reused. HELM=/path/to/helm overrides it.
# TOOLPOOL_HELM_SKIP_BINARIES=1 skips step 5 (it builds cmd/dispatcher and cmd/worker).
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=${HELM_VERSION:-v3.21.4}
KUBE_VERSION=${KUBE_VERSION:-1.33.0}
CHART=deploy/helm/toolpool
STACK=deploy/helm/toolpool-stack
VALIDATE_DIR=deploy/helm/validate
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/toolpool
GO=${GO:-go}

step() { printf '== %s\n' "$*" >&2; }
die() { printf 'check-helm: %s\n' "$*" >&2; exit 1; }

WORK=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- the files the chart loads with .Files.Get -----------------------------------------------------------
sync=false
[ "${1:-}" = "--sync" ] && sync=true
step "chart files in sync with deploy/prometheus and deploy/grafana"
for pair in deploy/prometheus/alerts.yaml:$CHART/files/alerts.yaml deploy/grafana/toolpool.json:$CHART/files/toolpool.json; do
  src=${pair%%:*} dst=${pair#*:}
  if [ ! -f "$src" ]; then
    # The observability files come from another part of the project; without them the chart keeps its copy.
    echo "   $src does not exist: nothing to compare $dst with (the chart renders its own copy)" >&2
    continue
  fi
  if $sync; then
    cp "$src" "$dst"
    echo "   copied $src to $dst" >&2
  elif ! cmp -s "$src" "$dst"; then
    diff -u "$dst" "$src" | head -20 >&2 || true
    die "$dst differs from $src: run scripts/check-helm.sh --sync (the chart can only read files inside itself)"
  fi
done

# --- helm ---------------------------------------------------------------------------------------------
if [ -z "${HELM:-}" ]; then
  HELM=$CACHE/helm-$HELM_VERSION/helm
  if [ ! -x "$HELM" ]; then
    step "building helm $HELM_VERSION from the Go module proxy into $(dirname "$HELM") (once; a few minutes)"
    mkdir -p "$(dirname "$HELM")"
    GOBIN=$(cd "$(dirname "$HELM")" && pwd) GOFLAGS=-mod=mod $GO install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  fi
fi
"$HELM" version --short >&2
# Keep helm away from the user's repositories and plugins: everything here is offline.
export HELM_CACHE_HOME=$WORK/helm/cache HELM_CONFIG_HOME=$WORK/helm/config HELM_DATA_HOME=$WORK/helm/data

# --- the validator --------------------------------------------------------------------------------------
step "validator: vet and tests (deploy/helm/validate, its own Go module)"
$GO -C "$VALIDATE_DIR" vet ./...
$GO -C "$VALIDATE_DIR" test -count=1 ./...
VALIDATE=$WORK/validate
$GO -C "$VALIDATE_DIR" build -o "$VALIDATE" .

# --- the Dockerfiles (no Docker engine here: parsed and checked, not built) ----------------------------
step "Dockerfiles: BuildKit's parser and instruction checks, build context, USER, ENTRYPOINT, OCI labels"
$GO -C deploy/docker/lint vet ./...
$GO -C deploy/docker/lint test -count=1 ./...
$GO -C deploy/docker/lint build -o "$WORK/dockerfile-lint" .
"$WORK/dockerfile-lint" -context . deploy/docker/*.Dockerfile

# --- the image builder (make images) ----------------------------------------------------------------------
step "image builder: vet and tests (deploy/images, its own Go module)"
$GO -C deploy/images vet ./...
$GO -C deploy/images test -count=1 ./...

# --- lint, template, validate for each values file ----------------------------------------------------
values_files=("" "$CHART"/ci/*.yaml)
for values in "${values_files[@]}"; do
  name=${values:+$(basename "$values" .yaml)}
  name=${name:-default}
  args=()
  [ -n "$values" ] && args=(-f "$values")
  step "$name: helm lint --strict"
  "$HELM" lint --strict "$CHART" "${args[@]}" --kube-version "$KUBE_VERSION" >"$WORK/lint.txt" 2>&1 || { cat "$WORK/lint.txt" >&2; die "helm lint failed for $name"; }
  # helm lint reports a template's fail() only as INFO: treat it as the error it is.
  if grep -q '\[INFO\] Fail:' "$WORK/lint.txt"; then cat "$WORK/lint.txt" >&2; die "helm lint: a template failed for $name"; fi
  step "$name: helm template and validate"
  out=$WORK/$name.yaml
  "$HELM" template toolpool "$CHART" --namespace toolpool "${args[@]}" --kube-version "$KUBE_VERSION" >"$out"
  # A values file names the objects it expects to exist already: "# validate-args: -external Secret/x".
  read -r -a vargs <<<"$( [ -n "$values" ] && sed -n 's/^# validate-args: //p' "$values" || true)"
  "$VALIDATE" "${vargs[@]}" -dump-configmaps "$WORK/$name.configmaps" "$out"
done

# --- the rendered configs against the real binaries ----------------------------------------------------
if [ "${TOOLPOOL_HELM_SKIP_BINARIES:-}" != 1 ]; then
  step "rendered configs: loaded by bin/dispatcher and bin/worker"
  CGO_ENABLED=0 $GO build -o "$WORK/bin/" ./cmd/dispatcher ./cmd/worker ./cmd/toolpool-runner ./cmd/toolpool-init
  for dir in "$WORK"/*.configmaps; do
    name=$(basename "$dir" .configmaps)
    # The dispatcher reads its config and policy before it connects to NATS: reaching the connection
    # (to a port where nothing listens) means both were accepted.
    for cfg in "$dir"/*-dispatcher/config.yaml; do
      [ -f "$cfg" ] || continue
      policy=()
      # Tenant policy files sit beside policy.yaml, in the pod and here.
      for p in "$dir"/*-policy/policy.yaml; do [ -f "$p" ] && policy=(--policy "$p"); done
      msg=$("$WORK/bin/dispatcher" --config "$cfg" "${policy[@]}" --listen 127.0.0.1:0 --data-dir "$WORK/ddata" \
        --nats-url nats://127.0.0.1:1 2>&1 || true)
      [[ "$msg" == *"connect nats"* ]] || die "$name: the dispatcher rejects the rendered config or policy: $msg"
      echo "   $name: dispatcher config${policy:+ and policy} accepted" >&2
    done
    # The worker reads its config before it dials containerd: give it a socket where nothing answers.
    for cfg in "$dir"/*-worker/config.yaml; do
      [ -f "$cfg" ] || continue
      ( msg=$("$WORK/bin/worker" --config "$cfg" --id check --nats-url nats://127.0.0.1:1 \
          --containerd-address "$WORK/none.sock" --data-dir "$WORK/wdata" --workspaces "$WORK/ws" 2>&1 || true)
        [[ "$msg" == *"containerd"* && "$msg" != *"read config"* ]] || { echo "check-helm: $name: the worker rejects the rendered config: $msg" >&2; exit 1; }
        echo "   $name: worker config accepted" >&2 ) &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do wait "$pid" || die "a worker config was rejected"; done
  pids=()
fi

# --- the umbrella chart -------------------------------------------------------------------------------
step "toolpool-stack: render with toolpool inside (the official NATS chart stubbed: it needs its repository)"
stack=$WORK/stack
cp -r "$STACK" "$stack"
mkdir -p "$stack/charts"
"$HELM" package "$CHART" -d "$stack/charts" >/dev/null
if ! ls "$STACK"/charts/nats-*.tgz >/dev/null 2>&1; then
  # Only so that helm finds a chart named nats: it renders nothing. `helm dependency update` puts the real
  # one in charts/ on a machine that reaches the NATS chart repository.
  mkdir -p "$stack/charts/nats"
  printf 'apiVersion: v2\nname: nats\nversion: 1.2.0\ndescription: offline stand-in for the official NATS chart\n' >"$stack/charts/nats/Chart.yaml"
else
  cp "$STACK"/charts/nats-*.tgz "$stack/charts/"
fi
"$HELM" lint --strict "$stack" --kube-version "$KUBE_VERSION" >"$WORK/lint.txt" 2>&1 || { cat "$WORK/lint.txt" >&2; die "helm lint failed for toolpool-stack"; }
"$HELM" template toolpool "$stack" --namespace toolpool --kube-version "$KUBE_VERSION" >"$WORK/stack.yaml"
grep -q 'nats://toolpool-nats:4222' <(grep '^  url:' "$WORK/stack.yaml" | awk '{print $2}' | tr -d '"' | base64 -d) \
  || die "toolpool-stack: toolpool does not point at the NATS chart's service"
"$VALIDATE" "$WORK/stack.yaml"

# --- bad input must fail, and say why -----------------------------------------------------------------
step "bad input fails with a clear message"
expect_fail() { # expect_fail WHAT WANT COMMAND...
  local what=$1 want=$2
  shift 2
  local msg
  if msg=$("$@" 2>&1); then die "$what: succeeded, want a failure"; fi
  [[ "$msg" == *"$want"* ]] || die "$what: failed without saying \"$want\": $msg"
  echo "   $what: fails: $(grep -F -m1 -- "$want" <<<"$msg" | sed 's/^ *//')" >&2
}
expect_fail "schema: dispatcher.replicas=three" "at '/dispatcher/replicas': got string, want integer" \
  "$HELM" template toolpool "$CHART" --set dispatcher.replicas=three
expect_fail "schema: misspelt key worker.slot" "additional properties 'slot' not allowed" \
  "$HELM" template toolpool "$CHART" --set worker.slot=8
expect_fail "schema: worker.workspaces.idleTTL=7days" "at '/worker/workspaces/idleTTL'" \
  "$HELM" template toolpool "$CHART" --set worker.workspaces.idleTTL=7days
expect_fail "template: external NATS without a URL" "set jetstream.external.url" \
  "$HELM" template toolpool "$CHART" --set jetstream.mode=external
broken=$WORK/broken
cp -r "$CHART" "$broken"
sed -i 's/terminationGracePeriodSeconds:/terminationGracePeriodSecond:/' "$broken/templates/dispatcher/deployment.yaml"
"$HELM" template toolpool "$broken" >"$WORK/broken.yaml"
expect_fail "validator: misspelt field in a template" 'unknown field "spec.template.spec.terminationGracePeriodSecond"' \
  "$VALIDATE" "$WORK/broken.yaml"

echo "check-helm: ok" >&2
