"""The head node's services: the MLflow tracking server and the cluster file the pipeline reads.

    python -m cluster.head start --shared /mnt/shared/duplex [--port 5000] [--host ADDRESS]
                                 [--auth [--admin-password-file PATH]]
                                 [--backend-store-uri URI] [--artifacts-destination URI]
    python -m cluster.head stop
    python -m cluster.head nodes [--wait N] [--timeout S]

`start` (run by cluster.yaml's head start commands after `ray start --head`) launches `mlflow server`
detached — runs and metrics in a database (default: sqlite on the shared file system; a
`postgresql://...` URI for a team server), artifacts in a shared store (default: a directory on the
shared file system; `s3://bucket/prefix` works with the node's IAM role), proxied by the server so
workers need no credentials of their own — waits until it answers, then writes the cluster file
(~/.duplex/cluster.json, or $DUPLEX_CLUSTER_FILE): the Ray address, the tracking URI workers can reach
(this node's private address), and the shared workdir root. `run_pipeline.py` on any node that has the
file uses all three (cluster/connect.py). `stop` ends the server by the PID the file records, once it has
checked that the PID is still that server (a stale file's PID may since belong to another process), and
removes the file. `start` also launches `watch`, which does the same once the head's Ray GCS stops
answering (`ray stop`, which `ray down` and every `ray up` run on the head), and first stops a server an
earlier `start` left (a second `ray up` on a running head).

The server binds this node's private address (the one it advertises), never every interface unless
`--host 0.0.0.0` asks for it. `--auth` runs MLflow's basic-auth app: users in a sqlite database next to
the tracking store, the admin's password read from `--admin-password-file` or $MLFLOW_AUTH_ADMIN_PASSWORD
and handed to the server by environment only (docs/cluster.md, Security).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from cluster import ClusterError, probe
from cluster.connect import CLUSTER_FILE_ENV, cluster_file_path


ALL_INTERFACES = ("0.0.0.0", "::")
ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"  # MLflow's own name: the auth app reads it on first start
ADMIN_USERNAME = "admin"
MIN_PASSWORD = 12  # characters; MLflow's basic-auth app refuses a shorter admin password
SECRET_KEY_ENV = "MLFLOW_FLASK_SERVER_SECRET_KEY"  # MLflow's name; the auth app refuses to start without it
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"  # MLflow's name; start_mlflow turns it off by default


def write_auth_config(directory: Path) -> Path:
    """MLflow's basic-auth settings (`MLFLOW_AUTH_CONFIG_PATH`): users in `<directory>/basic_auth.db`,
    every signed-in user may read, the admin named `admin`. No password: that comes by environment."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "basic_auth.ini"
    path.write_text("[mlflow]\ndefault_permission = READ\n"
                    f"database_uri = sqlite:///{directory.resolve()}/basic_auth.db\n"
                    f"admin_username = {ADMIN_USERNAME}\n"
                    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
                    encoding="utf-8")
    return path


def admin_password(password_file: str) -> str:
    """The MLflow admin password: the first line of `password_file`, else $MLFLOW_AUTH_ADMIN_PASSWORD."""
    if password_file:
        lines = Path(password_file).expanduser().read_text(encoding="utf-8").splitlines()
        password = lines[0].strip() if lines else ""
    else:
        password = os.environ.get(ADMIN_PASSWORD_ENV, "")
    if importlib.util.find_spec("flask_wtf") is None:  # the auth app's CSRF check; absent, the server dies
        raise SystemExit("--auth needs MLflow's auth extra: pip install 'mlflow[auth]==3.17.2' (Flask-WTF)")
    if not password:
        raise SystemExit(f"--auth needs the admin password: --admin-password-file PATH or ${ADMIN_PASSWORD_ENV} "
                         "(docs/cluster.md, Security)")
    if len(password) < MIN_PASSWORD:  # MLflow's own rule: the server would exit at its first start
        raise SystemExit(f"--auth: the admin password has {len(password)} characters, MLflow needs at least "
                         f"{MIN_PASSWORD} (e.g. openssl rand -base64 24)")
    return password


def allowed(advertise: str, port: int) -> tuple[str, str]:
    """MLflow's `--allowed-hosts` and `--cors-allowed-origins` for a server advertised as `advertise`:
    exactly that name and localhost (a port-forwarded UI), with and without the port; never `*`. MLflow 3's
    default accepts only localhost and private-range Host headers, so a public or DNS name that workers and
    browsers use was refused ("Invalid Host header - possible DNS rebinding attack")."""
    names = list(dict.fromkeys([advertise, "localhost", "127.0.0.1"]))
    return (",".join(h for name in names for h in (name, f"{name}:{port}")),
            ",".join(f"http://{name}:{port}" for name in names))


def start_mlflow(backend_store_uri: str, artifacts_destination: str, host: str, port: int, log_path: Path,
                 timeout_s: float = 120.0, auth_config: Path | None = None,
                 password: str = "", advertise: str = "", workers: int = 1) -> subprocess.Popen:
    """`mlflow server` in its own session (it outlives the caller), ready when this returns: its /health
    answered a request that names it as workers will (`advertise`, default `host`, in the Host header). With
    `auth_config`, the basic-auth app, its admin password passed in the server's environment only. One
    `workers` process serves requests on a thread pool (MLflow's app is WSGI): enough for a head whose clients
    log metrics; more for a big head's many clients."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    advertise = advertise or ("127.0.0.1" if host in ALL_INTERFACES else host)
    hosts, origins = allowed(advertise, port)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
               "--artifacts-destination", artifacts_destination, "--host", host, "--port", str(port),
               "--workers", str(workers), "--allowed-hosts", hosts, "--cors-allowed-origins", origins]
    if workers > 1:
        # Several workers run under uvicorn's supervisor, which restarts a worker that does not answer its ping
        # within 5 s: on a busy head (seen on 2 cores beside two pipeline runs) one still importing MLflow
        # missed it every time and the server never became ready. One worker has no supervisor at all.
        command += ["--uvicorn-opts", "--timeout-worker-healthcheck 60"]
    env = dict(os.environ)
    # MLflow's job execution (GenAI scorers, trace archival; nothing this project uses) adds a job runner and
    # seven Huey consumers, each importing MLflow: 10 processes and 2.3 GiB instead of 2 and 0.5 GiB, and
    # ~30 CPU-s instead of ~8 in the first 25 s on 2 cores. Off unless the environment turns it on.
    env.setdefault(JOB_EXECUTION_ENV, "false")
    if auth_config is not None:
        command += ["--app-name", "basic-auth"]
        env.update({"MLFLOW_AUTH_CONFIG_PATH": str(auth_config), ADMIN_PASSWORD_ENV: password})
        # The auth app signs its CSRF tokens with this key; a fresh one per start unless one is given (a restart
        # then only logs UI sessions out).
        env.setdefault(SECRET_KEY_ENV, secrets.token_urlsafe(32))
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=env)
    base = f"http://{'127.0.0.1' if host in ALL_INTERFACES else host}:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise ClusterError(f"mlflow server exited with code {process.returncode} ({_last_line(log_path)}); "
                               f"see {log_path}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:  # needs no login
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        process.terminate()
        raise ClusterError(f"mlflow server did not answer {base}/health within {timeout_s:.0f} s; see {log_path}")
    # Named as workers name it: /health is exempt from MLflow's Host check, the API is not (a login
    # failure, 401, means the name passed).
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers={"Host": f"{advertise}:{port}"})
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as error:
        if error.code != 401:
            process.terminate()
            raise ClusterError(f"mlflow server refused a request for {advertise}:{port} (HTTP {error.code}: "
                               f"{error.read()[:200].decode(errors='replace')}); see {log_path}") from None
    return process


def _last_line(log_path: Path) -> str:
    """The last non-empty line of the server's log (where it says why it stopped), at most 300 characters."""
    try:
        lines = [line for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip()[:300] if lines else "an empty log"


def node_address() -> str:
    """This node's address as Ray sees it (the private one on a cloud VM)."""
    import ray.util

    return ray.util.get_node_ip_address()


def gcs_address(ray_address: str) -> str:
    """host:port of the Ray cluster `ray_address` names ("auto": the one started on this node)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(ray_address) or ""
    except ConnectionError:  # no Ray on this node to follow
        return ""


def start(args: argparse.Namespace) -> int:
    if cluster_file_path().is_file():  # a restart (`ray up` again): the previous server holds the port
        stop_server(quiet=True)
    shared = Path(args.shared).expanduser().resolve()
    (shared / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    backend = args.backend_store_uri or f"sqlite:///{shared}/mlflow/mlflow.db"
    artifacts = args.artifacts_destination or str(shared / "mlflow" / "artifacts")
    address = args.advertise or node_address()
    host = args.host or address  # the private address workers reach, not every interface
    if host in ALL_INTERFACES:
        print(f"WARNING: mlflow server listens on every interface ({host}){'' if args.auth else ' without authentication'}; "
              "anyone who reaches this node can use it — bind the private address instead (docs/cluster.md)",
              file=sys.stderr)
    password = admin_password(args.admin_password_file) if args.auth else ""
    taken = probe.port_taken(host, args.port)  # before, not from the server's log after it died
    if taken is not None:
        raise ClusterError(f"the MLflow server's address {host}:{args.port} {taken}: stop that process, or give "
                           f"--port another port")
    auth_config = write_auth_config(shared / "mlflow" / "auth") if args.auth else None
    process = start_mlflow(backend, artifacts, host, args.port, shared / "mlflow" / f"server-{address}.log",
                           auth_config=auth_config, password=password, advertise=address, workers=args.workers)
    # The head's GCS by address, not "auto": "auto" means whichever Ray instance last ran `ray start` (or
    # ray.cluster_utils) on this machine — Ray keeps one such address per machine in /tmp/ray — so a second
    # Ray instance on the head would take this cluster's drivers, and Ray jobs' too (the job supervisor
    # resolves "auto" the same way for RAY_ADDRESS; the pipeline connects to the file's address instead).
    gcs = gcs_address(args.ray_address)
    info = {"ray_address": gcs or args.ray_address, "tracking_uri": f"http://{address}:{args.port}",
            "shared_dir": str(shared), "mlflow_pid": process.pid, "backend_store_uri": backend,
            "artifacts_destination": artifacts, "mlflow_host": host,
            "mlflow_auth": ADMIN_USERNAME if args.auth else ""}  # the user name only, never the password
    path = cluster_file_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")  # readers never see a half-written file
    partial.write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)
    if gcs:  # the server and the file live as long as the head's Ray (`ray down` runs `ray stop` there)
        with open(shared / "mlflow" / f"watch-{address}.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "cluster.head", "watch", "--gcs", gcs], cwd=Path(__file__).parents[1],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, CLUSTER_FILE_ENV: str(path)})
    print(f"mlflow server pid {process.pid} at {info['tracking_uri']}; cluster file {path}"
          + (f"; both end when Ray at {gcs} does" if gcs else ""))
    return 0


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def gone(gcs: str, interval: float, misses: int, wanted: Callable[[], bool] = lambda: True) -> bool:
    """Wait until the Ray GCS at `gcs` has refused connections `misses` checks in a row, `interval` s apart
    (True), or until `wanted()` says the wait is no longer needed (False)."""
    missed = 0
    while missed < misses:
        time.sleep(interval)
        if not wanted():
            return False
        missed = 0 if reachable(gcs) else missed + 1
    return True


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    """`--gcs`, `--interval`, `--misses`: what a watcher of the head's Ray (`gone`) is told."""
    parser.add_argument("--gcs", required=True, help="host:port of the head's Ray GCS")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between checks")
    parser.add_argument("--misses", type=int, default=3, help="failed checks in a row that mean Ray is gone")


def watch(args: argparse.Namespace) -> int:
    """Run beside the MLflow server `start` launched: once the head's Ray GCS (`--gcs`) has refused
    connections `--misses` times in a row (`ray stop`, `ray down`), stop the server and remove the cluster
    file (`stop_server`). Ends by itself when the cluster file is gone or names another server."""
    path = cluster_file_path()
    try:
        pid = json.loads(path.read_text(encoding="utf-8"))["mlflow_pid"]
    except (OSError, ValueError, KeyError):
        return 1

    def ours() -> bool:  # not stopped by hand, no newer `start` took over
        try:
            return json.loads(path.read_text(encoding="utf-8"))["mlflow_pid"] == pid
        except (OSError, ValueError, KeyError):
            return False

    if not gone(args.gcs, args.interval, args.misses, ours):
        return 0
    print(f"{time.strftime('%FT%T')} Ray at {args.gcs} is gone: stopping the mlflow server", flush=True)
    return stop_server()


def command_line(pid: int) -> list[str] | None:
    """The arguments process `pid` was started with (/proc, else `ps`); None when no such process runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's: its command line says whose
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self/cmdline").is_file():
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return None  # exited, not yet reaped
            # Empty for a kernel thread or a process caught mid-exec: alive, and not provably ours.
            return proc.joinpath("cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except (FileNotFoundError, ProcessLookupError):
            return None
    done = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else None


def is_our_server(argv: list[str], backend_store_uri: str) -> bool:
    """`argv` is an `mlflow server` on this cluster file's backend store."""
    mlflow = any(Path(arg).name == "mlflow" for arg in argv)
    return mlflow and "server" in argv and bool(backend_store_uri) and backend_store_uri in argv


def stop(_: argparse.Namespace) -> int:
    return stop_server()


def stop_server(quiet: bool = False) -> int:
    """Stop the MLflow server the cluster file records (if it still is that server) and remove the file."""
    path = cluster_file_path()
    if not path.is_file():
        if not quiet:
            print(f"no cluster file at {path} (set ${CLUSTER_FILE_ENV} if it lives elsewhere)", file=sys.stderr)
        return 1
    info = json.loads(path.read_text(encoding="utf-8"))
    pid = int(info["mlflow_pid"])
    argv = command_line(pid)
    if argv is None:
        print(f"mlflow server pid {pid} was not running; removed the stale cluster file {path}")
        path.unlink()
        return 0
    if not is_our_server(argv, info.get("backend_store_uri", "")):
        print(f"pid {pid} in {path} is not this cluster's mlflow server ({' '.join(argv)[:120]}); "
              "not signalled, cluster file kept", file=sys.stderr)
        return 1
    # The server leads its own session (start_new_session): signal its group, gunicorn/uvicorn workers too.
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGTERM)
    else:
        os.kill(pid, signal.SIGTERM)
    path.unlink()
    return 0


def nodes(args: argparse.Namespace) -> int:
    """Wait until the cluster has `--wait` live nodes (`ray up` returns before its workers have joined: the
    head's autoscaler starts them), then list every live node; exit 1 when they are not there in time."""
    import ray

    from cluster.connect import read_cluster_file

    info = read_cluster_file()
    address = args.ray_address or (info or {}).get("ray_address") or "auto"
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    deadline = time.monotonic() + args.timeout
    while True:
        alive = [node for node in ray.nodes() if node["Alive"]]
        if len(alive) >= args.wait or time.monotonic() > deadline:
            break
        time.sleep(2)
    for node in sorted(alive, key=lambda n: n["NodeManagerAddress"]):
        resources = node["Resources"]
        print(f"{node['NodeManagerAddress']:<16} {node['NodeManagerHostname']:<24} {resources.get('CPU', 0):g} CPU "
              f"{resources.get('GPU', 0):g} GPU{'  (head)' if 'node:__internal_head__' in resources else ''}")
    if len(alive) < args.wait:
        print(f"{len(alive)} of {args.wait} nodes after {args.timeout:g} s: see the head's "
              f"monitor.* logs (`ray monitor CLUSTER.yaml`) for the workers' start", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.head", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="start the MLflow server and write the cluster file")
    begin.add_argument("--shared", required=True, help="workdir root on the shared file system")
    begin.add_argument("--port", type=int, default=5000)
    begin.add_argument("--workers", type=int, default=1,
                       help="mlflow server worker processes (one serves on threads; more for many clients)")
    begin.add_argument("--host", default="",
                       help="address to bind (default: the advertised private address; 0.0.0.0 warns)")
    begin.add_argument("--auth", action="store_true",
                       help="run MLflow's basic-auth app (admin password from the file or $MLFLOW_AUTH_ADMIN_PASSWORD)")
    begin.add_argument("--admin-password-file", default="",
                       help="with --auth: a file (mode 600) whose first line is the admin password")
    begin.add_argument("--advertise", default="", help="address workers use (default: this node's Ray address)")
    begin.add_argument("--ray-address", default="auto", help="the head's Ray (default: the one `ray start` ran on this node); the "
                       "cluster file records its GCS host:port")
    begin.add_argument("--backend-store-uri", default="", help="default: sqlite:///<shared>/mlflow/mlflow.db")
    begin.add_argument("--artifacts-destination", default="", help="default: <shared>/mlflow/artifacts")
    commands.add_parser("stop", help="stop the MLflow server recorded in the cluster file")
    add_watch_arguments(commands.add_parser("watch", help="(started by `start`) stop the server when the head's Ray is gone"))
    listing = commands.add_parser("nodes", help="list the cluster's live nodes, after waiting for --wait of them")
    listing.add_argument("--wait", type=int, default=0, help="live nodes to wait for (head included)")
    listing.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for them")
    listing.add_argument("--ray-address", default="", help="default: the cluster file's, else the one on this node")
    args = parser.parse_args(argv)
    try:
        return {"start": start, "stop": stop, "watch": watch, "nodes": nodes}[args.command](args)
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
