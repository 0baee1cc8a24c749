#!/usr/bin/env bash
# Runs the dispatcher (with an embedded NATS) and one worker (with a private containerd) in the foreground.
# Ctrl-C stops both; the worker kills its calls' containers and its containerd before it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "make run needs root: the worker starts containerd and runs containers" >&2
  exit 1
fi
DATA=${TOOLPOOL_DATA:-$PWD/.data}
LISTEN=${TOOLPOOL_LISTEN:-127.0.0.1:8080}
export TOOLPOOL_TOKEN=${TOOLPOOL_TOKEN:-dev}
mkdir -p "$DATA"

# http_ok HOST PORT PATH: true when the endpoint answers 200 (bash only: a fresh machine may lack curl).
# It runs in a subshell so that its redirections never touch the script's own descriptors.
http_ok() {
  (
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
    read -r -t 2 line <&3 || exit 1
    [[ "$line" == *" 200 "* ]]
  ) 2>/dev/null
}

pids=()
stop() {
  trap - INT TERM EXIT
  echo >&2
  echo "stopping toolpool..." >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "stopped." >&2
}
trap stop INT TERM HUP EXIT

# The console's pool page reads the worker's metrics (its --listen below).
printf 'console:\n  worker_metrics: [http://127.0.0.1:9091/metrics]\n' > "$DATA/dispatcher.yaml"
bin/dispatcher --dev-tenant --config "$DATA/dispatcher.yaml" --listen "$LISTEN" --data-dir "$DATA/dispatcher" --nats-listen 127.0.0.1:4222 2> >(tee -a "$DATA/dispatcher.log" >&2) &
pids+=($!)
for _ in $(seq 1 100); do
  http_ok "${LISTEN%:*}" "${LISTEN##*:}" /healthz && break
  sleep 0.1
done
# TOOLPOOL_GVISOR=1 (make installs gVisor first): every call runs under gVisor instead of runc.
runtime=runc
if [ "${TOOLPOOL_GVISOR:-}" = 1 ]; then runtime=gvisor; fi
bin/worker --data-dir "$DATA/worker" --nats-url nats://127.0.0.1:4222 --listen 127.0.0.1:9091 --drain-timeout 10s --runtime "$runtime" 2> >(tee -a "$DATA/worker.log" >&2) &
pids+=($!)
for _ in $(seq 1 200); do
  http_ok 127.0.0.1 9091 /readyz && break
  sleep 0.1
done

cat >&2 <<MSG

toolpool is running on http://$LISTEN (tenant dev, token \$TOOLPOOL_TOKEN=$TOOLPOOL_TOKEN, calls under $runtime). Try:

  curl -s -X POST http://$LISTEN/v1/calls \\
    -H "Authorization: Bearer $TOOLPOOL_TOKEN" -H 'Content-Type: application/json' \\
    -d '{"tool":"run_shell","args":{"command":"echo hi; uname -a"},"workspace":"ws1"}'

  bin/toolpool call run_shell --workspace ws1 command='ls -la'
  bin/toolpool tools

The web console: http://$LISTEN/console/ (sign in with the token).

Logs: $DATA/dispatcher.log, $DATA/worker.log. Ctrl-C stops everything.

MSG
wait -n "${pids[@]}" || true
