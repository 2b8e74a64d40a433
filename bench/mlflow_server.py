"""What the head's MLflow server costs, with and without MLflow's job execution.

    python -m bench.mlflow_server [--job-execution default|false|true] [--idle 25]

Starts `cluster.head.start_mlflow` on a fresh sqlite store in a temporary directory (the way `cluster.head start`
does, loopback), waits `--idle` seconds, then counts the processes of the server's session, their RSS and CPU
seconds, sends SIGTERM to the session and times the exit. `--job-execution default` leaves
MLFLOW_SERVER_ENABLE_JOB_EXECUTION to `start_mlflow` (off unless set); `true` is MLflow's own default. Prints one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench import free_port
from cluster import head


def _session(pid: int, fields: str) -> list[str]:
    return subprocess.run(["ps", "-o", f"{fields}=", "-s", str(pid)], capture_output=True, text=True).stdout.split("\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job-execution", choices=("default", "false", "true"), default="default")
    parser.add_argument("--idle", type=float, default=25.0, help="seconds between ready and the count")
    args = parser.parse_args(argv)
    if args.job_execution != "default":
        os.environ[head.JOB_EXECUTION_ENV] = args.job_execution
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        server = head.start_mlflow(f"sqlite:///{tmp}/mlflow.db", f"{tmp}/artifacts", "127.0.0.1", port,
                                   Path(tmp) / "server.log")
        ready = time.perf_counter() - start
        try:
            time.sleep(args.idle)
            rss = [int(x) for x in _session(server.pid, "rss") if x.strip()]
            cpu = [int(x) for x in _session(server.pid, "times") if x.strip()]
        finally:
            stop = time.perf_counter()
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                raise
    result = {"job_execution": os.environ.get(head.JOB_EXECUTION_ENV, "default (start_mlflow: false)"),
              "processes": len(rss), "rss_mib": sum(rss) // 1024, "cpu_s": sum(cpu), "ready_s": round(ready, 1),
              "exit_after_sigterm_s": round(time.perf_counter() - stop, 1), "idle_s": args.idle,
              "cores": os.cpu_count()}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
