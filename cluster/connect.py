"""Connect the driver to Ray — a running cluster (`ray.address`) or a local instance started here — and
pick up the cluster file the head node writes (cluster/head.py), so that on a cluster `run_pipeline.py`
finds the Ray address, the MLflow server and the shared workdir without any option."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

from cluster import ClusterError, probe

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_FILE_ENV = "DUPLEX_CLUSTER_FILE"


def cluster_file_path() -> Path:
    """$DUPLEX_CLUSTER_FILE, else ~/.duplex/cluster.json."""
    return Path(os.environ.get(CLUSTER_FILE_ENV) or Path.home() / ".duplex" / "cluster.json").expanduser()


def read_cluster_file() -> dict[str, Any] | None:
    """The head's cluster file (keys `ray_address`, `tracking_uri`, `shared_dir`), or None off a cluster."""
    path = cluster_file_path()
    if not path.is_file():
        return None
    info = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in ("ray_address", "tracking_uri", "shared_dir") if not info.get(key)]
    if missing:
        raise ClusterError(f"{path}: cluster file lacks {missing}; rewrite it with `python -m cluster.head start`")
    return info


def cluster_overrides(ray_address: str, tracking_enabled: bool, tracking_uri: str, workdir: str) -> list[str]:
    """`key=value` overrides that put a run on the cluster described by the cluster file: its Ray address,
    its MLflow server and a workdir under the shared directory — each only where the run's config (after
    the user's own overrides: the arguments) left it unset or relative. Empty off a cluster."""
    info = read_cluster_file()
    if info is None:
        return []
    overrides = []
    if not ray_address:
        overrides.append(f"ray.address={info['ray_address']}")
    if tracking_enabled and not tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        overrides.append(f"tracking.uri={info['tracking_uri']}")
    if not Path(workdir).is_absolute():
        overrides.append(f"workdir={Path(info['shared_dir']) / workdir}")
    return overrides


# What Ray's own processes print on the driver's terminal: Ray Data's INFO lines (every execution plan, every
# progress report) are dropped; warnings and errors still show. A value the user set wins. Local instances
# only: Ray Train's preemption watcher (spot instances on a cloud cluster; each fit otherwise prints an
# error-level line about its constructor arguments).
QUIET_ENV = {"RAY_DATA_LOG_LEVEL": "WARNING"}
# Ray Train's controller polls its workers every 2 s by default, and a fit only ends on the polls that see its
# workers finish: ~8 s of idle waiting after the last update of every training stage (a 4-update teacher stage
# on 2 cores: 27.1 s -> 17.5 s, bench/train_start.py). Set in this process, Ray Train passes it on to its
# controller and workers (ray.train.v2's get_env_vars_to_propagate), on a local instance or a cluster alike.
TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
# MLflow's client retries a tracking server that stopped answering 7 times with a backoff factor of 2 and waits
# 120 s for each answer: a server that died mid-run held the training workers for hours (each failed log a
# worker failure, each restart another round of retries). Bounded here, for this process and every worker (local:
# they inherit it; a cluster: the runtime env): a refused connection is given up after ~3-5 s (2 retries, 1 s
# and 2 s apart, MLflow's jitter up to 1 s each), a server that accepts but never answers after 3 × 20 s (an
# answer may take a while: a model's upload). A value the user exported wins.
TRACKING_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
LOCAL_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
             # What Ray Data says about its progress bars (off in a log file) to its log file (the YAML says where).
             "RAY_DATA_LOGGING_CONFIG": str(Path(__file__).resolve().with_name("ray_data_logging.yaml"))}
# Ray 2.60 turns token authentication on for every new local instance (what we want) and says so in a warning
# on every start, which nobody can act on but by turning it off. Dropped from this process's log (setting
# RAY_AUTH_MODE=token instead is too late once ray is imported: Ray reads it into a config cached at import).
TOKEN_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


def actor_pool_options() -> dict[str, int]:
    """Extra `map_batches` options of our Ray Data actor pools (tokenize, distill): on a one-node cluster (the
    default local instance) no actor restarts (`max_restarts=0`). Ray Data restarts its actors forever by default,
    and Ray's core then prints an error-level line at the first pool, "has constructor arguments in the object
    store and max_restarts > 0 ... the actor restart will fail" (ray-project/ray#53727), which a user cannot act on. On
    one node a restart only follows a crash of the actor itself; without it the stage fails, leaves nothing
    behind and runs again. A multi-node cluster keeps Ray's restarts (a lost node's actors come back elsewhere)."""
    import ray

    return {"max_restarts": 0} if len([node for node in ray.nodes() if node.get("Alive")]) == 1 else {}


@contextlib.contextmanager
def remote_args_allowed() -> Iterator[None]:
    """Around a `map_batches` given `actor_pool_options`: Ray 2.60 warns that passing remote args as keywords is
    deprecated ("use the named remote parameters instead"), but `max_restarts` has no named parameter (Ray Data's
    own comment still says map_batches(..., max_restarts=0)): that one warning is silenced here, no other."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        yield


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TOKEN_AUTH_NOTICE)


def connect(address: str = "", num_cpus: int = 0, object_store_memory_mb: int = 0, dashboard: bool = True) -> None:
    """Connect this process to Ray once (run_pipeline.py calls it before the first stage that needs Ray); a
    no-op when the process (or a test fixture) already did. `address` empty starts a local instance of
    `num_cpus` CPUs (0 = all) and an object store of `object_store_memory_mb` (0 = Ray's default), with the
    dashboard unless `dashboard` is false (see below; http://127.0.0.1:8265 while the run lasts, another port when
    that one is taken: Ray prints the address)."""
    import ray

    if ray.is_initialized():
        return
    for key, value in {**TRAIN_ENV, **TRACKING_ENV}.items():  # a value the user exported wins
        os.environ.setdefault(key, value)
    if not address:  # before Ray Data reads them (at import: reconfigured below if it was imported already)
        for key, value in LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    if "ray.data" in sys.modules:
        from ray.data._internal.logging import configure_logging

        configure_logging()
    import ray.data

    quiet = {key: os.environ.get(key, value) for key, value in {**QUIET_ENV, **TRACKING_ENV}.items()}
    logging.getLogger("ray.data").setLevel(quiet["RAY_DATA_LOG_LEVEL"])  # this process's, if Ray Data is loaded
    if address:
        # Ray's client retries an address that refuses or never answers for minutes: asked first, briefly
        problem = probe.ray_gcs(address)
        detail = f": it {problem}" if problem else ""
        try:
            if problem is None:
                ray.init(address=address, runtime_env=cluster_runtime_env(quiet))
        except ConnectionError as error:
            detail = f" ({str(error).strip().splitlines()[0][:200]})"
        if detail:
            where = cluster_file_path()
            hint = (f"; {where} (written by `python -m cluster.head start`) still names it: if that cluster is "
                    f"gone (`ray down`), run `python -m cluster.head stop` or delete the file" if where.is_file() else
                    "; start the cluster (`ray up cluster.yaml`, or `ray start --head` on that host) or leave "
                    "ray.address empty to run on a local instance")
            raise ClusterError(f"no Ray cluster answers at ray.address={address}{detail}{hint}") from None
    else:
        # The local instance's processes inherit this environment.
        for key, value in quiet.items():
            os.environ.setdefault(key, value)
        # The dashboard serves the State API (`ray list actors`, the tests' checks) and the dashboard a user opens.
        # address="local": a new instance of our own; without it ray.init() joins any cluster already
        # running on this machine (another user's, or one with no free CPU) and the run waits forever.
        notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
        if not any(isinstance(f, _DropTokenAuthNotice) for f in notice.filters):
            notice.addFilter(_DropTokenAuthNotice())
        os.environ["RAY_TMPDIR"] = str(local_ray_tmpdir())  # the instance's processes inherit it
        kwargs: dict[str, Any] = {"address": "local", "include_dashboard": dashboard}
        if num_cpus:
            kwargs["num_cpus"] = num_cpus
        if object_store_memory_mb:
            kwargs["object_store_memory"] = object_store_memory_mb * 1024 * 1024
        if dashboard:
            init_local(kwargs)
        else:  # no port to bind, no State API to point the instance's processes at
            ray.init(**kwargs)
    # Ray Data's progress bars on a terminal; in a log file each refresh would be a line (actors too: they
    # get the driver's DataContext). Ray Data says so in each process: to ray-data.log (LOCAL_ENV).
    ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()
    log.info("ray: %s CPUs available", ray.available_resources().get("CPU", 0))


# Where a local instance's processes find its State API (Ray's own variable; the `ray job` CLI reads it too).
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
DASHBOARD_PORT = 8265  # Ray's default: the one a user knows, when it is free
DASHBOARD_TRIES = 3  # starts of a local instance whose dashboard port another process took first


def init_local(kwargs: dict[str, Any]) -> Any:
    """`ray.init(**kwargs)` for a new local instance with a dashboard: the dashboard on a port chosen here (8265
    when free), and every process of the instance told where its State API is ($RAY_API_SERVER_ADDRESS, set while
    `ray.init` starts the instance's processes, which inherit it, and its workers from them; then put back, since
    it overrides the address of every State API call this process makes later, to any cluster). Without it a
    process of the instance that asks the State API with no address (as Ray Train V2's PlacementGroupCleaner did,
    every second, before `raytrain.trainer_class` left it out) finds its cluster by listing the machine's raylets,
    and with a second Ray on the machine (another user's, a `ray start` cluster, the cluster test beside the suite)
    it gets "Found multiple active Ray instances".

    Ray binds a port it is given once, with no retry ("Failed to find a valid port for dashboard after 0 retries";
    only its own default, 8265, gets 50): two runs starting at the same moment both find 8265 free and one loses
    it. A start that lost its port is ended (`_DashboardWatch`, `_end_new_children`) and made again on another free
    one, up to DASHBOARD_TRIES starts in all (one for a port the caller chose); then one line naming the ports."""
    chosen = kwargs.get("dashboard_port")
    port = chosen or free_port(DASHBOARD_PORT)
    lost: list[int] = []
    while True:
        try:
            return _init_on_port(kwargs, port)
        except _LostPort:
            lost.append(port)
        if len(lost) == (1 if chosen else DASHBOARD_TRIES):
            break
        port = free_port()
        log.info("ray: another process took dashboard port %s as this instance started; trying %s", lost[-1], port)
    if chosen:
        raise ClusterError(f"Ray's dashboard could not bind 127.0.0.1:{chosen}: another process has it; choose another "
                           f"dashboard_port")
    raise ClusterError(f"Ray's dashboard lost its port to another process {len(lost)} times ({lost}, each free on "
                       f"127.0.0.1 when chosen: Ray instances starting at the same moment); start the run again")


class _LostPort(Exception):
    """`ray.init` failed because another process bound the dashboard's port first."""


class _HoldDashboardFailure(logging.Filter):
    """Holds back the two error lines Ray logs when its dashboard fails to start: dropped when the start is made
    again on another port, logged after all when the failure is another (its exception carries the dashboard's log)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(("Failed to start the dashboard", "Error should be written to 'dashboard.log'")):
            self.held.append(record)
            return False
        return True


def _init_on_port(kwargs: dict[str, Any], port: int) -> Any:
    """One `ray.init` with the dashboard on `port`; `_LostPort` (the failed start's processes ended) when another
    process bound `port` first, between our check and the dashboard's bind."""
    import psutil
    import ray

    before = os.environ.get(API_SERVER_ENV)
    os.environ[API_SERVER_ENV] = f"http://127.0.0.1:{port}"
    services = logging.getLogger("ray._private.services")
    hold = _HoldDashboardFailure()
    services.addFilter(hold)
    children = set(psutil.Process().children(recursive=True))
    watch = _DashboardWatch(port, children)
    watch.start()
    try:
        return ray.init(**{**kwargs, "include_dashboard": True, "dashboard_port": port})
    except Exception as error:
        services.removeFilter(hold)
        # Ray's two wordings: its own check before the dashboard starts (ray/_private/services.py,
        # start_api_server), the dashboard's bind (the last lines of its log, which the exception carries).
        if not (watch.lost or any(lost in str(error) for lost in (f"127.0.0.1:{port} because it's already occupied",
                                                                  _lost_line(port)))):
            for record in hold.held:
                services.handle(record)
            raise
        _end_new_children(children)
        raise _LostPort(port) from None
    finally:
        watch.done.set()
        watch.join()
        services.removeFilter(hold)
        if before is None:
            os.environ.pop(API_SERVER_ENV, None)
        else:
            os.environ[API_SERVER_ENV] = before


def _lost_line(port: int) -> str:
    """How Ray's dashboard says another process has its port (its log; "Failed to find a valid port for dashboard
    after 0 retries: [Errno 98] error while attempting to bind on address ('127.0.0.1', PORT): ...")."""
    return f"('127.0.0.1', {port}): address already in use"


class _DashboardWatch(threading.Thread):
    """Ends the dashboard `ray.init` starts on `port` as soon as its log says another process has the port. Such
    a dashboard stays alive (its module processes keep it from exiting) and `ray.init` waits for it until its
    startup timeout, 60 s; ended, it is seen dead and `ray.init` raises at once."""

    def __init__(self, port: int, before: set[Any]) -> None:
        super().__init__(name="dashboard-watch", daemon=True)
        self.port, self.before = port, before
        self.done, self.lost = threading.Event(), False

    def run(self) -> None:
        import psutil

        dashboard, log_file = None, None
        while not self.done.wait(0.2):
            try:
                if dashboard is None:
                    for child in set(psutil.Process().children()) - self.before:
                        command = child.cmdline()
                        if f"--port={self.port}" in command and any(a.endswith("dashboard.py") for a in command):
                            log_dir = next(a.split("=", 1)[1] for a in command if a.startswith("--log-dir="))
                            dashboard, log_file = child, Path(log_dir) / "dashboard.log"
                    continue
                with open(log_file, "rb") as lines:
                    lines.seek(max(0, os.fstat(lines.fileno()).st_size - 16384))
                    if _lost_line(self.port) not in lines.read().decode(errors="replace"):
                        continue
                self.lost = True
                for process in [*dashboard.children(recursive=True), dashboard]:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
                return
            except (psutil.Error, OSError, StopIteration):
                continue


def _end_new_children(before: set[Any]) -> None:
    """End what a failed `ray.init` left running (its GCS server and monitor; Ray keeps no handle on a node that
    failed to start, and they would live as long as this process, beside the instance started next): this
    process's children that are not in `before` and their descendants. Not a new descendant of an older child: a
    process started meanwhile by another subprocess of this one (a test's cluster hosts, a notebook's jobs) is not
    Ray's (CI saw such a job's driver SIGTERMed when a dashboard port was lost beside it)."""
    import psutil

    new = [child for child in psutil.Process().children() if child not in before]
    left = list(new)
    for child in new:
        with contextlib.suppress(psutil.Error):
            left.extend(child.children(recursive=True))
    for child in left:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=5)


def free_port(preferred: int = 0) -> int:
    """`preferred` if free on the loopback, else a free port below Linux's ephemeral range (32768-60999). A port
    from bind(0) is itself ephemeral, and one was seen taken again, by a Ray process starting in between, before
    the dashboard could bind it; ports outside that range are never handed out by bind(0)."""
    import random
    import socket

    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.is_file() else 32768
    candidates = [preferred] if preferred else []
    for port in candidates + random.Random().sample(range(20000, min(low, 32768)), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ClusterError("no free loopback port between 20000 and the ephemeral range for the Ray dashboard")


def local_ray_tmpdir() -> Path:
    """Where a local Ray instance keeps its files (RAY_TMPDIR; Ray adds `ray/`): $RAY_TMPDIR when set, else
    <system temp>/duplex-<uid>, made mode 700 and refused unless it is this user's own directory. Not Ray's
    machine-wide /tmp/ray: whoever creates that first owns it (mode 755, e.g. a root `ray up` on this machine)
    and every other user's Ray then dies with "Permission denied: '/tmp/ray/session_...'" (the cluster YAMLs
    use the same directory, docs/cluster.md)."""
    import tempfile

    if os.environ.get("RAY_TMPDIR"):
        return Path(os.environ["RAY_TMPDIR"])
    path = Path(tempfile.gettempdir()) / f"duplex-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        raise ClusterError(f"{path} is not this user's own directory (Ray's files of a local run go there); remove it, "
                           f"or set RAY_TMPDIR to a directory of yours")
    return path


def cluster_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The runtime env a driver on a cluster asks for: workers on other machines import `pipeline` from the
    shipped working directory, with `env_vars`. A driver started by `ray job submit` already has the job's
    runtime env (RAY_JOB_CONFIG_JSON_ENV_VAR): Ray refuses to merge two working directories or one variable
    set twice, so only what the job's lacks is asked for (its `--working-dir` ships this same project)."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    runtime_env: dict[str, Any] = {}
    if not job.get("working_dir"):
        runtime_env.update(working_dir=str(REPO_ROOT), excludes=[".venv/", ".git/", "runs/", "*.parquet"])
    env = {key: value for key, value in env_vars.items() if key not in (job.get("env_vars") or {})}
    if env:
        runtime_env["env_vars"] = env
    return runtime_env


def check_shared_storage(workdir: Path, timeout_s: float = 120.0) -> int:
    """Fail fast unless every alive node sees `workdir` (stage outputs and Ray Train checkpoints are read
    back by other nodes; Ray no longer syncs them). Writes a probe file, reads it from a zero-CPU task
    pinned to each node, removes it. Returns the number of nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = workdir / f".shared-probe-{token}"
    probe.write_text(token, encoding="utf-8")
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        reader = ray.remote(num_cpus=0)(_read_probe)
        pending = {reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(str(probe)): n for n in nodes}
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        blind = [pending[ref]["NodeManagerAddress"] for ref in ready if ray.get(ref) != token]
        blind += [f"{pending[ref]['NodeManagerAddress']} (no answer in {timeout_s:.0f} s)" for ref in late]
    finally:
        probe.unlink(missing_ok=True)
    if blind:
        raise ClusterError(f"workdir {workdir} is not on storage every node shares: nodes {blind} cannot read "
                         f"it. Put the workdir on the cluster's shared file system (docs/cluster.md).")
    return len(nodes)


def _read_probe(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        return f"unreadable: {error}"
