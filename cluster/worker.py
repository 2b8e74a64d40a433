"""A worker node's companion: its Ray ends when the head's does.

    python -m cluster.worker watch --gcs HEAD:6379 [--interval 5] [--misses 3] [--detach]

`ray down` on the local provider (cluster/onprem.yaml) runs `ray stop` on the head only; a worker's Ray
notices on its own, slowly or never: measured on a worker of tests/cluster/test_ray_up.py's two hosts, its
raylet went 60 s after `ray down`, its agents 120 s, and its log monitor was still running 240 s later.
`watch` (started by onprem.yaml's worker start commands, `--detach`: in its own session, log in
`$RAY_TMPDIR/duplex-watch.log`) runs `ray stop` on this node once the head's GCS has refused connections
`--misses` times in a row, `--interval` s apart, and then ends. Without GCS fault tolerance (an external
Redis, which this project does not set up) a worker cannot rejoin a head that went away anyway: a head that
restarts is a new cluster, whose autoscaler starts the workers' Ray again. A newer `watch` on the node
replaces an older one (its pid file).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster.head import add_watch_arguments, gone


def pid_file() -> Path:
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "duplex-watch.pid"


def detach(args: argparse.Namespace) -> int:
    """Start `watch` in a session of its own (it outlives the SSH command that started it) and return."""
    log = pid_file().with_name("duplex-watch.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "cluster.worker", "watch", "--gcs", args.gcs,
                                    "--interval", str(args.interval), "--misses", str(args.misses)],
                                   cwd=Path(__file__).parents[1], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"watching the head's Ray at {args.gcs} (pid {process.pid}, log {log}): this node's Ray stops with it")
    return 0


def replace_older() -> None:
    """Stop the `watch` an earlier start left on this node (its pid, if it still is one), record ours."""
    path = pid_file()
    try:
        pid = int(path.read_text())
        if pid != os.getpid() and b"cluster.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))


def watch(args: argparse.Namespace) -> int:
    if args.detach:
        return detach(args)
    replace_older()
    gone(args.gcs, args.interval, args.misses)
    print(f"{time.strftime('%FT%T')} the head's Ray at {args.gcs} is gone: ray stop", flush=True)
    ray = Path(sys.executable).with_name("ray")
    done = subprocess.run([str(ray), "stop"], capture_output=True, text=True)
    print(done.stdout + done.stderr, flush=True)
    pid_file().unlink(missing_ok=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    watcher = commands.add_parser("watch", help="run `ray stop` here once the head's Ray is gone")
    add_watch_arguments(watcher)
    watcher.add_argument("--detach", action="store_true", help="start the watcher in its own session and return")
    args = parser.parse_args(argv)
    return watch(args)


if __name__ == "__main__":
    sys.exit(main())
