"""Two local runs starting at the same moment each get their own Ray (cluster/connect.py `init_local`): the
dashboard port they both found free goes to one, the other starts again on another."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cluster import ClusterError, connect

REPO_ROOT = Path(__file__).resolve().parents[2]

# One run's start: `connect` as run_pipeline.py calls it, released with the other by the file `go`. Both prefer
# the same free port, as two runs on a machine whose 8265 is free (it may be taken here). The State API must
# answer on the port the instance ended up with, to this process and to the instance's workers.
RUN = """
import json, os, re, sys, time
from pathlib import Path
import psutil
from cluster import connect
import ray
from ray.util.state import list_nodes

go, connect.DASHBOARD_PORT = Path(sys.argv[1]), int(sys.argv[2])
Path(f"{go}.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.005)
connect.connect("", num_cpus=1, object_store_memory_mb=100)
url = "http://" + ray._private.worker.global_worker.node.webui_url
told = ray.get(ray.remote(num_cpus=0)(lambda: os.environ.get(connect.API_SERVER_ENV)).remote(), timeout=120)
nodes = len(list_nodes(address=ray.get_runtime_context().gcs_address))
sessions = set()  # of this process's Ray processes: one instance's, none left by a lost start
for child in psutil.Process().children(recursive=True):
    try:
        sessions.update(re.findall(r"session_[0-9_-]+", " ".join(child.cmdline())))
    except psutil.Error:
        pass
ray.shutdown()
print(json.dumps({"url": url, "told": told, "nodes": nodes, "sessions": sorted(sessions)}))
"""


def ray_processes(tmpdir: Path) -> list[psutil.Process]:
    """The processes of the Ray instances that keep their files in `tmpdir` (each names its session there)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(tmpdir) in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


@pytest.mark.slow
def test_two_local_runs_started_at_the_same_moment_each_get_their_own_ray(tmp_path):
    """Both start (old code: one died on "Failed to find a valid port for dashboard after 0 retries"), each
    with its own dashboard that its workers are told of, both shut down and leave no process behind."""
    tmpdir = Path(os.environ["RAY_TMPDIR"]) / "2r"  # one for both, as two runs of one user; short: socket paths
    go = tmp_path / "go"
    env = {**os.environ, "RAY_TMPDIR": str(tmpdir), "RAY_AUTH_MODE": "disabled"}
    env.pop(connect.API_SERVER_ENV, None)
    preferred = str(connect.free_port())  # one for both
    runs = [subprocess.Popen([sys.executable, "-c", RUN, str(go), preferred], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() < deadline:  # both imported Ray
            assert all(run.poll() is None for run in runs), [run.communicate() for run in runs]
            time.sleep(0.05)
        go.touch()
        outputs = [run.communicate(timeout=300) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    failed = [(run.returncode, err[-2000:]) for run, (_, err) in zip(runs, outputs) if run.returncode]
    assert not failed
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert results[0]["url"] != results[1]["url"]
    for result in results:
        assert result["told"] == result["url"] and result["nodes"] == 1
        assert len(result["sessions"]) == 1, result  # a lost start's processes (GCS, monitor, dashboard) ended
    # and the instances' end with them
    left, deadline = ray_processes(tmpdir), time.monotonic() + 20
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ray_processes(tmpdir)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert not [process.pid for process in left]


@pytest.mark.parametrize("wording", [
    "Failed to bind to 127.0.0.1:{port} because it's already occupied. You can use `ray start --dashboard-port`",
    "\nFailed to find a valid port for dashboard after 0 retries: [Errno 98] error while attempting to bind on "
    "address ('127.0.0.1', {port}): address already in use"])
def test_a_lost_dashboard_port_is_tried_again_elsewhere_then_one_line(monkeypatch, wording):
    """Ray's two wordings of a port taken between our check and its bind; a start on another port follows, and
    after DASHBOARD_TRIES losses one line names the ports and what to do."""
    import ray

    ports = iter([20001, 20002, 20003, 20004, 20005])
    monkeypatch.setattr(connect, "free_port", lambda preferred=0: next(ports))
    tried = []

    def lose(**kwargs):
        tried.append(kwargs["dashboard_port"])
        raise Exception(wording.format(port=kwargs["dashboard_port"]))

    monkeypatch.setattr(ray, "init", lose)
    with pytest.raises(ClusterError) as error:
        connect.init_local({"address": "local"})
    assert tried == [20001, 20002, 20003] and len(tried) == connect.DASHBOARD_TRIES
    assert "\n" not in str(error.value) and "[20001, 20002, 20003]" in str(error.value)
    assert "start the run again" in str(error.value)
    with pytest.raises(ClusterError, match="127.0.0.1:20009: another process has it; choose another dashboard_port"):
        connect.init_local({"address": "local", "dashboard_port": 20009})  # the caller's port: tried once
    assert tried[3:] == [20009]

    outcomes = [Exception(wording.format(port=20004)), "context"]

    def lose_once(**kwargs):
        tried.append(kwargs["dashboard_port"])
        if isinstance(outcomes[0], Exception):
            raise outcomes.pop(0)
        return outcomes.pop(0)

    monkeypatch.setattr(ray, "init", lose_once)
    assert connect.init_local({"address": "local"}) == "context"  # lost once, then started on the next port
    assert tried[4:] == [20004, 20005]


def test_another_start_failure_is_raised_as_ray_raised_it(monkeypatch):
    """Only a lost port is retried: any other failure (here another port in use) comes out of the first start
    unchanged."""
    import ray

    calls = []

    def fail(**kwargs):
        calls.append(kwargs)
        raise ValueError("('127.0.0.1', 1): address already in use")

    monkeypatch.setattr(ray, "init", fail)
    with pytest.raises(ValueError, match="'127.0.0.1', 1"):
        connect.init_local({"address": "local", "dashboard_port": 20001})
    assert len(calls) == 1


def test_a_lost_start_ends_only_the_processes_it_started(tmp_path):
    """What a failed `ray.init` left (this process's new children and theirs) is ended; a process that an older
    child started meanwhile is not: the cluster test's hosts are children of the test process, and a lost-port test
    beside them once SIGTERMed the driver of a Ray job one of them had just started."""
    older = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; input(); "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                             stdin=subprocess.PIPE, text=True)
    try:
        before = set(psutil.Process().children(recursive=True))
        older.stdin.write("\n")
        older.stdin.flush()  # the older child starts its own child now, after `before`
        ray_like = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                     "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
        deadline = time.monotonic() + 30
        while not (psutil.Process(older.pid).children() and psutil.Process(ray_like.pid).children()):
            assert time.monotonic() < deadline, "the children did not start theirs"
            time.sleep(0.05)
        bystander, = psutil.Process(older.pid).children()
        ray_child, = psutil.Process(ray_like.pid).children()
        connect._end_new_children(before)
        assert ray_like.wait(timeout=10) is not None
        psutil.wait_procs([ray_child], timeout=10)
        assert not ray_child.is_running() or ray_child.status() == psutil.STATUS_ZOMBIE
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE and older.poll() is None
    finally:
        for process in psutil.Process(older.pid).children(recursive=True) if older.poll() is None else []:
            process.kill()
        older.kill()
        older.wait()
