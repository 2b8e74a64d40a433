"""The head node's services: the MLflow tracking server and the cluster file the pipeline reads.

    python -m cluster.head start --shared /mnt/shared/duplex [--port 5000] [--host 0.0.0.0]
                                 [--backend-store-uri URI] [--artifacts-destination URI]
    python -m cluster.head stop

`start` (run by cluster.yaml's head start commands after `ray start --head`) launches `mlflow server`
detached — runs and metrics in a database (default: sqlite on the shared file system; a
`postgresql://...` URI for a team server), artifacts in a shared store (default: a directory on the
shared file system; `s3://bucket/prefix` works with the node's IAM role), proxied by the server so
workers need no credentials of their own — waits until it answers, then writes the cluster file
(~/.duplex/cluster.json, or $DUPLEX_CLUSTER_FILE): the Ray address, the tracking URI workers can reach
(this node's private address), and the shared workdir root. `run_pipeline.py` on any node that has the
file uses all three (cluster/connect.py). `stop` ends the server by the PID the file records.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cluster.connect import CLUSTER_FILE_ENV, cluster_file_path


def start_mlflow(backend_store_uri: str, artifacts_destination: str, host: str, port: int, log_path: Path,
                 timeout_s: float = 120.0) -> subprocess.Popen:
    """`mlflow server` in its own session (it outlives the caller), ready when this returns."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
               "--artifacts-destination", artifacts_destination, "--host", host, "--port", str(port),
               "--workers", "2"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    probe = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/health"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(probe, timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"mlflow server did not answer {probe} within {timeout_s:.0f} s; see {log_path}")


def node_address() -> str:
    """This node's address as Ray sees it (the private one on a cloud VM)."""
    import ray.util

    return ray.util.get_node_ip_address()


def start(args: argparse.Namespace) -> int:
    shared = Path(args.shared).expanduser().resolve()
    (shared / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    backend = args.backend_store_uri or f"sqlite:///{shared}/mlflow/mlflow.db"
    artifacts = args.artifacts_destination or str(shared / "mlflow" / "artifacts")
    address = args.advertise or node_address()
    process = start_mlflow(backend, artifacts, args.host, args.port, shared / "mlflow" / f"server-{address}.log")
    info = {"ray_address": args.ray_address, "tracking_uri": f"http://{address}:{args.port}",
            "shared_dir": str(shared), "mlflow_pid": process.pid, "backend_store_uri": backend,
            "artifacts_destination": artifacts}
    path = cluster_file_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")  # readers never see a half-written file
    partial.write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)
    print(f"mlflow server pid {process.pid} at {info['tracking_uri']}; cluster file {path}")
    return 0


def stop(_: argparse.Namespace) -> int:
    path = cluster_file_path()
    if not path.is_file():
        print(f"no cluster file at {path} (set ${CLUSTER_FILE_ENV} if it lives elsewhere)", file=sys.stderr)
        return 1
    pid = json.loads(path.read_text(encoding="utf-8"))["mlflow_pid"]
    try:
        os.killpg(pid, signal.SIGTERM)  # the server and its gunicorn/uvicorn workers share its session
    except ProcessLookupError:
        print(f"mlflow server pid {pid} was not running")
    path.unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.head", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="start the MLflow server and write the cluster file")
    begin.add_argument("--shared", required=True, help="workdir root on the shared file system")
    begin.add_argument("--port", type=int, default=5000)
    begin.add_argument("--host", default="0.0.0.0",
                       help="interface to bind (EC2 instances hold only their private address; see docs/cluster.md)")
    begin.add_argument("--advertise", default="", help="address workers use (default: this node's Ray address)")
    begin.add_argument("--ray-address", default="auto", help="what drivers on this node pass to ray.init")
    begin.add_argument("--backend-store-uri", default="", help="default: sqlite:///<shared>/mlflow/mlflow.db")
    begin.add_argument("--artifacts-destination", default="", help="default: <shared>/mlflow/artifacts")
    commands.add_parser("stop", help="stop the MLflow server recorded in the cluster file")
    args = parser.parse_args(argv)
    return start(args) if args.command == "start" else stop(args)


if __name__ == "__main__":
    sys.exit(main())
