"""How often two local runs started at the same moment collide in their Ray start (the dashboard port both
found free: "Failed to find a valid port for dashboard after 0 retries").

Each repeat starts two processes that call `cluster.connect.connect` as run_pipeline.py does, released by one
file, in one Ray directory of their own (as two runs of one user), each then `ray.shutdown()`. Both prefer the
same free port, as two runs on a machine whose 8265 is free (`--port 8265` asks for Ray's own, when free here).

    python -m bench.two_runs [--repeats 20] [--port P]

Prints one line per repeat (exit codes, each run's dashboard URL and start time, its lost ports), then the
totals as JSON: repeats, collided (a run failed), retried (a run's start lost its port and started again on
another), left (Ray processes still alive after both ended); exits 1 if any collided or left a process.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run(go: Path, port: int) -> None:
    """One run's start (a child process): wait for `go`, connect, say where the dashboard is, shut down."""
    from cluster import connect
    import ray

    lost: list[str] = []

    class Lost(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "took dashboard port" in str(record.msg):
                lost.append(str(record.args[0]))

    logging.getLogger("cluster.connect").addHandler(Lost())
    logging.getLogger("cluster.connect").setLevel(logging.INFO)
    connect.DASHBOARD_PORT = port
    Path(f"{go}.{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.005)
    start = time.monotonic()
    connect.connect("", num_cpus=1, object_store_memory_mb=100)
    seconds = time.monotonic() - start
    url = "http://" + ray._private.worker.global_worker.node.webui_url
    ray.shutdown()
    print(json.dumps({"url": url, "start_s": round(seconds, 1), "lost": lost}))


def ray_pids(tmpdir: Path) -> list[int]:
    """Processes whose command line names `tmpdir` (the Ray processes of instances keeping their files there)."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(str(tmpdir) in a for a in p.info["cmdline"] or ())]


def repeat(index: int, port: int, tmp: Path) -> dict:
    """Two simultaneous starts; what each said, or its last error line."""
    from cluster.connect import free_port

    go, tmpdir = tmp / f"go{index}", tmp / f"r{index}"
    env = {**os.environ, "RAY_TMPDIR": str(tmpdir), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    env.pop("RAY_API_SERVER_ADDRESS", None)
    preferred = port or free_port()
    command = [sys.executable, "-m", "bench.two_runs", "--run", str(go), str(preferred)]
    runs = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp.glob(f"go{index}.*"))) < 2 and time.monotonic() < deadline:
            if any(r.poll() is not None for r in runs):
                break
            time.sleep(0.05)
        go.touch()
        outputs = [r.communicate(timeout=600) for r in runs]
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait()
    results = []
    for r, (out, err) in zip(runs, outputs):
        if r.returncode == 0:
            results.append(json.loads(out.strip().splitlines()[-1]))
        else:
            lines = [line for line in err.splitlines() if line.strip()]
            results.append({"error": (lines[-1] if lines else f"exit {r.returncode}")[:300]})
    left = ray_pids(tmpdir)
    deadline = time.monotonic() + 20
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ray_pids(tmpdir)
    for pid in left:  # ours: they name this repeat's own Ray directory
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return {"codes": [r.returncode for r in runs], "port": preferred, "runs": results, "left": len(left)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--port", type=int, default=0, help="the port both prefer (default: a free one per repeat)")
    parser.add_argument("--run", nargs=2, metavar=("GO", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        run(Path(args.run[0]), int(args.run[1]))
        return 0
    totals = {"repeats": args.repeats, "collided": 0, "retried": 0, "left": 0, "start_s": []}
    with tempfile.TemporaryDirectory(prefix="dpx2-", dir="/tmp") as tmp:  # short: Ray's socket paths
        for index in range(args.repeats):
            result = repeat(index, args.port, Path(tmp))
            totals["collided"] += any(result["codes"])
            totals["retried"] += sum(bool(r.get("lost")) for r in result["runs"])
            totals["left"] += result["left"]
            totals["start_s"] += [r["start_s"] for r in result["runs"] if "start_s" in r]
            print(f"repeat {index + 1:3d}: {json.dumps(result)}", flush=True)
    totals["start_s"] = {"max": max(totals["start_s"], default=0.0),
                         "mean": round(sum(totals["start_s"]) / max(len(totals["start_s"]), 1), 1)}
    print(json.dumps(totals))
    return 1 if totals["collided"] or totals["left"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
