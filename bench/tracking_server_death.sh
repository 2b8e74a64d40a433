#!/usr/bin/env bash
# The MLflow tracking server killed while a run trains: what the user sees, and how long after the kill the run
# ends (docs/RESULTS.md, "Reliability"). Starts a local `mlflow server` in its own process group, runs the smoke
# config against it (train.max_steps=200), SIGKILLs the server's group 8 s after the train stage starts, and
# prints the seconds from the kill to the run's end, its exit code and its last lines.
#
#     bash bench/tracking_server_death.sh [WORKDIR]      # default /tmp/duplex-tracking-death (removed first)
set -uo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/duplex-tracking-death}
rm -rf "$W" && mkdir -p "$W"
PORT=$(.venv/bin/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
setsid .venv/bin/mlflow server --host 127.0.0.1 --port "$PORT" --backend-store-uri "sqlite:///$W/mlflow.db" \
  --default-artifact-root "$W/artifacts" > "$W/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
start=$(date +%s)
.venv/bin/python run_pipeline.py --config configs/smoke.yaml "workdir=$W/work" tracking.enabled=true \
  "tracking.uri=http://127.0.0.1:$PORT" train.max_steps=200 > "$W/run.log" 2>&1 &
RUN=$!
until grep -q "\[6/7\] train: running" "$W/run.log" 2> /dev/null; do sleep 0.5; kill -0 "$RUN" 2> /dev/null || break; done
sleep 8
kill -9 -- "-$SERVER"
sleep 0.5
curl -sf -m 2 "http://127.0.0.1:$PORT/health" > /dev/null && echo "the server still answers: the drill is void"
killed=$(date +%s)
echo "server killed at +$((killed - start)) s"
wait "$RUN"
rc=$?
echo "run ended: exit $rc at +$(($(date +%s) - start)) s, $(($(date +%s) - killed)) s after the kill"
tail -3 "$W/run.log" | cut -c1-600
