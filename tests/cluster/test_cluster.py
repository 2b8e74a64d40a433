"""cluster.yaml / cluster/onprem.yaml against Ray's own launcher validator, the cluster file the head writes,
and a real two-node Ray cluster on loopback: the smoke pipeline with its two training workers on different
nodes, MLflow through an `mlflow server`, and a training worker killed by PID mid-run."""
from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster import ClusterError, check, connect, head, worker
from tests.checkpoints import registered_under
from tests.conftest import free_port
import run_pipeline
from pipeline.config import load_config
from pipeline.tracking.store import STAGE_TAG

REPO_ROOT = Path(__file__).resolve().parents[2]
YAMLS = [REPO_ROOT / "cluster.yaml", REPO_ROOT / "cluster" / "onprem.yaml"]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_shipped_cluster_yamls_pass_rays_validator(path):
    prepared = check.validate(load(path))
    assert prepared["head_node_type"] in prepared["available_node_types"]
    text = path.read_text(encoding="utf-8")
    assert "RAY_AUTH_MODE=token ray start --head" in text or "RAY_AUTH_MODE=token ~/duplex/.venv/bin/ray start --head" in text
    assert "cluster.head start --shared /mnt/shared/duplex" in text
    assert "~/.ray/auth_token" in text  # the token travels as a file mount, never in the repository
    assert check.placeholders(text), "the shipped files are templates: their placeholders must be listed"


def test_aws_yaml_has_cpu_head_and_two_gpu_worker_types_and_opens_only_ssh():
    config = check.validate(load(YAMLS[0]))
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["node_config"]["InstanceType"].startswith("m")
    workers = {name: spec for name, spec in types.items() if name != config["head_node_type"]}
    assert {spec["node_config"]["InstanceType"] for spec in workers.values()} == {"g5.2xlarge", "p4d.24xlarge"}
    assert all(spec["min_workers"] == 0 and spec["max_workers"] >= 1 for spec in workers.values())
    rules = config["provider"]["security_group"]["IpPermissions"]
    assert [(rule["FromPort"], rule["ToPort"]) for rule in rules] == [(22, 22)]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
@pytest.mark.parametrize("breakage", ["misspelled_top_key", "misspelled_node_key", "head_type_missing"])
def test_broken_copies_fail_rays_validator(path, breakage, tmp_path):
    config = load(path)
    broken = copy.deepcopy(config)
    if breakage == "misspelled_top_key":
        broken["setup_comands"] = broken.pop("setup_commands")
    elif breakage == "misspelled_node_key":
        if "available_node_types" in broken:
            broken["available_node_types"]["gpu_1x"]["min_workerz"] = broken["available_node_types"]["gpu_1x"].pop("min_workers")
        else:  # the local provider builds its node types from head_ip / worker_ips
            broken["provider"]["head_ipp"] = broken["provider"].pop("head_ip")
    else:
        if "head_node_type" in broken:
            del broken["head_node_type"]
        else:
            del broken["provider"]["head_ip"]
    with pytest.raises(Exception) as caught:
        check.validate(broken)
    assert caught.type.__name__ in ("ValidationError", "ValueError", "ClickException"), caught.value
    target = tmp_path / path.name
    target.write_text(yaml.safe_dump(broken), encoding="utf-8")
    assert check.check(target) == 1


def test_cluster_file_supplies_address_tracking_and_shared_workdir(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    smoke = REPO_ROOT / "configs" / "smoke.yaml"
    cfg = load_config(smoke, ["tracking.enabled=true"])
    laptop = (cfg.ray.address, cfg.tracking.enabled, cfg.tracking.uri, cfg.workdir)
    assert connect.cluster_overrides(*laptop) == []  # no file: a laptop run, nothing changes
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"ray_address": "10.0.0.5:6379", "tracking_uri": "http://10.0.0.5:5000", "shared_dir": "/mnt/shared/duplex"}))
    assert connect.cluster_overrides(*laptop) == ["ray.address=10.0.0.5:6379", "tracking.uri=http://10.0.0.5:5000",
                                              "workdir=/mnt/shared/duplex/runs/smoke"]
    mine = ("auto", True, "http://elsewhere:5000", str(tmp_path / "mine"))
    assert connect.cluster_overrides(*mine) == []  # what the user set wins
    on_cluster = run_pipeline.load_run_config(str(smoke), ["tracking.enabled=true"])  # the driver applies them
    assert (on_cluster.ray.address, on_cluster.tracking.uri, on_cluster.workdir) == \
        ("10.0.0.5:6379", "http://10.0.0.5:5000", "/mnt/shared/duplex/runs/smoke")
    (tmp_path / "cluster.json").write_text(json.dumps({"ray_address": "auto"}))
    with pytest.raises(ClusterError, match="cluster.json: cluster file lacks"):
        connect.cluster_overrides(*laptop)


def test_a_local_run_starts_its_own_ray_instead_of_joining_one_running_here(monkeypatch):
    """ray.init() without an address joins any Ray instance already running on the machine (seen: one with no
    free CPU, and the run hung): connect() asks for a new local instance, or the configured cluster."""
    import ray

    calls = []
    for key in (*connect.QUIET_ENV, *connect.LOCAL_ENV, *connect.TRAIN_ENV, *connect.TRACKING_ENV):  # restored after
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.delenv(connect.API_SERVER_ENV, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append({**kwargs, "env": os.environ.get(connect.API_SERVER_ENV)}))
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 1.0})
    connect.connect("", num_cpus=2, object_store_memory_mb=100)
    connect.connect("10.0.0.5:6379")
    port, told = calls[0].pop("dashboard_port"), calls[0].pop("env")
    assert calls[0] == {"address": "local", "include_dashboard": True, "num_cpus": 2,
                        "object_store_memory": 100 * 1024 * 1024}
    # the local instance's processes inherit where its State API is (tests/pipeline/test_raytrain.py tries it);
    # this process's own calls do not keep it (it overrides the address of every State API call, to any cluster)
    assert told == f"http://127.0.0.1:{port}" and calls[1]["env"] is None
    assert connect.API_SERVER_ENV not in os.environ
    assert calls[1]["address"] == "10.0.0.5:6379"
    # Ray's INFO lines stay in its log files: the local instance inherits the setting, a cluster's workers get it
    assert os.environ["RAY_DATA_LOG_LEVEL"] == "WARNING" == calls[1]["runtime_env"]["env_vars"]["RAY_DATA_LOG_LEVEL"]
    # Ray Train's controller polls its workers every 0.2 s, not 2 s: what Ray Train hands its controller
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    assert get_env_vars_to_propagate()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.2"
    # MLflow's client gives a tracking server that stopped answering seconds, not minutes: here, in the local
    # instance's processes (inherited) and in a cluster's workers (the runtime env)
    for key, value in connect.TRACKING_ENV.items():
        assert os.environ[key] == value == calls[1]["runtime_env"]["env_vars"][key]


def test_the_dashboard_gets_its_usual_port_when_free_and_another_free_one_otherwise():
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        other = connect.free_port(taken)
        assert other != taken and 20000 <= other < 32768
    assert connect.free_port(taken) == taken  # released: the preferred port again


def test_a_driver_started_by_ray_job_submit_asks_only_for_what_the_jobs_runtime_env_lacks(monkeypatch):
    """`ray job submit --working-dir . -- python run_pipeline.py ...` used to die in 7 s: "Failed to merge the
    Job's runtime env ... with a ray.init's runtime env" (both named a working_dir). Checked with Ray's own merge."""
    from ray._private.worker import _merge_runtime_env

    quiet = {"RAY_DATA_LOG_LEVEL": "WARNING"}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    plain = connect.cluster_runtime_env(quiet)  # `ray exec` / a driver on the head: ship the project
    assert plain["working_dir"] == str(connect.REPO_ROOT) and plain["env_vars"] == quiet
    job = {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip", "env_vars": {"RAY_DATA_LOG_LEVEL": "INFO"}}
    assert _merge_runtime_env(job, plain, override=False) is None  # what Ray refused
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": job}))
    inside = connect.cluster_runtime_env(quiet)
    assert inside == {} and _merge_runtime_env(job, inside, override=False) == job  # the job's own, the user's level
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}}))  # submitted without one
    assert connect.cluster_runtime_env(quiet) == plain


def test_a_cluster_file_whose_cluster_is_gone_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    """After `ray down` the cluster file used to stay and every plain run died with a raw ConnectionError."""
    import ray

    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    (tmp_path / "cluster.json").write_text(json.dumps({"ray_address": "auto", "tracking_uri": "http://10.0.0.5:5000",
                                                       "shared_dir": str(tmp_path)}))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def gone(**kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    monkeypatch.setattr(ray, "init", gone)
    with pytest.raises(ClusterError, match=r"^no Ray cluster answers at ray.address=auto \(Could not find any running "
                                           r"Ray instance.*\); .*cluster.json \(written by `python -m cluster.head "
                                           r"start`\) still names it: if that cluster is gone \(`ray down`\), run "
                                           r"`python -m cluster.head stop` or delete the file$"):
        connect.connect("auto")


def test_the_cluster_package_imports_without_torch_pipeline_or_reder():
    """The head node's services run where torch is not installed: importing cluster/ must not pull it in."""
    blocker = ("import builtins, sys\n"
               "real = builtins.__import__\n"
               "def guarded(name, *args, **kwargs):\n"
               "    if name.split('.')[0] in ('torch', 'pipeline', 'reder'):\n"
               "        raise ImportError(f'cluster/ imported {name}')\n"
               "    return real(name, *args, **kwargs)\n"
               "builtins.__import__ = guarded\n"
               "import cluster.head, cluster.connect, cluster.check, cluster.worker\n"
               "assert not {'torch', 'pipeline', 'reder'} & {m.split('.')[0] for m in sys.modules}\n")
    done = subprocess.run([sys.executable, "-c", blocker], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([sys.executable, "-m", "cluster.head", "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True).returncode == 0


def wait_for(predicate, timeout_s: float, what: str, process: subprocess.Popen, log: Path):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"driver exited ({process.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}:\n{log.read_text()[-4000:]}")


@pytest.mark.slow
def test_two_node_cluster_spreads_training_and_a_node_lost_for_good_stops_it_then_it_goes_on_with_fewer(
        tmp_path, monkeypatch):
    """Head + second node (1 CPU each, 200 MB object stores, auth mode set), the head's MLflow server and
    cluster file via `python -m cluster.head`, then `run_pipeline.py` as a driver that finds all of it in the
    cluster file, its 2 training workers spread over the nodes. After the first checkpoint the second node is
    removed for good: Ray Train's group cannot be placed again, and the stage stops within
    (max_failures + 1) × start_timeout_s of the loss with a message that says what to do, keeping its
    checkpoints and leaving no RUNNING run. The same command with train.min_workers=1 (an elastic group; the
    stage's key unchanged) resumes from the last checkpoint on the head alone and finishes every step, each
    update over both ranks' batch (update_freq 2)."""
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # every process of this test cluster inherits it
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    shared = tmp_path / "shared"
    node_args = {"num_cpus": 1, "object_store_memory": 200 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={**node_args, "include_dashboard": True, "dashboard_port": free_port()})
    try:
        second = cluster.add_node(**node_args)
        port = free_port()
        assert head.main(["start", "--shared", str(shared), "--host", "127.0.0.1", "--advertise", "127.0.0.1",
                          "--port", str(port), "--ray-address", cluster.address]) == 0
        uri = f"http://127.0.0.1:{port}"
        steps, timeout_s, max_failures = 40, 5, 1
        command = [sys.executable, "run_pipeline.py", "--config", "configs/smoke.yaml", "tracking.enabled=true",
                   "train.placement_strategy=SPREAD", f"train.max_steps={steps}", "train.cpus_per_worker=1",
                   f"train.max_failures={max_failures}", f"train.start_timeout_s={timeout_s}",
                   "distill.enabled=false", "evaluate.teacher_baseline=false", "train.valid_max_sentences=10",
                   "evaluate.max_sentences=10"]  # validation and evaluate on 10 sentences: the drill is about placement
        log = tmp_path / "driver.log"
        with open(log, "wb") as out:
            driver = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        workdir = shared / "runs" / "smoke"
        first = wait_for(lambda: registered_under(workdir / "ray_results", "*"), 400,
                         "the first registered checkpoint", driver, log)[0]

        def train_workers():
            return list_actors(address=cluster.address, filters=[("class_name", "=", "RayTrainWorker")],
                               detail=True, raise_on_missing_output=False)

        alive = wait_for(lambda: [a for a in train_workers() if a.state == "ALIVE"], 60, "live workers", driver, log)
        assert len({a.node_id for a in alive}) == 2, f"SPREAD must place the 2 workers on 2 nodes: {alive}"
        lost = time.monotonic()
        cluster.remove_node(second)
        code = driver.wait(timeout=300)
        stopped_after_s = time.monotonic() - lost
        output = log.read_text()
        assert "on a Ray cluster (cluster file)" in output and "cluster: 2 nodes see the workdir" in output
        assert code == 2, output[-6000:]
        # Ray's node death detection (~2 s here: the removed raylet's connection closes), then max_failures + 1
        # placements of start_timeout_s each (11.6 s in all, measured)
        assert stopped_after_s <= 60 + (max_failures + 1) * timeout_s, (stopped_after_s, output[-3000:])
        last = output.strip().splitlines()[-1]
        assert re.fullmatch(rf"error: train: Ray Train could not place its 2 worker\(s\) within train\.start_timeout_s="
                            rf"{timeout_s} s, 2 tries \(a host lost for good\?\); its checkpoints are kept under "
                            rf".*: run the same command again once the cluster has the resources, or add "
                            rf"train\.min_workers=1 to go on from the last checkpoint with the hosts that remain", last), last
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("duplex").experiment_id
        assert not [r.info.run_name for r in client.search_runs([experiment]) if r.info.status == "RUNNING"]

        with open(log, "wb") as out:  # the same command on the head alone, elastic
            driver = subprocess.Popen(command + ["train.min_workers=1"], cwd=REPO_ROOT, stdout=out,
                                      stderr=subprocess.STDOUT, env=dict(os.environ))
        assert driver.wait(timeout=500) == 0, log.read_text()[-6000:]
        output = log.read_text()
        assert "cluster: 1 nodes see the workdir" in output, output[-3000:]
        assert "train: 1 of 2 workers (a host lost): update_freq 2" in output, output[-3000:]
        print(f"the node lost for good: the stage stopped {stopped_after_s:.1f} s after")
        summary = json.loads((workdir / "last_run.json").read_text())
        assert summary["stages"]["train"]["counts"]["restarts"] >= 1
        train_out = Path(summary["stages"]["train"]["output"])
        assert train_out.parent == workdir and len(list(workdir.glob("train-*"))) == 1  # the key did not change
        report = json.loads((train_out / "report.json").read_text())
        assert len(report["workers"]) == 1, report["workers"]  # the last group: one rank, on the head
        history = json.loads((train_out / "history.json").read_text())
        resumed = [h["resumed_from"] for h in history if "resumed_from" in h]
        first_step = int(json.loads((first / "history.json").read_text())[-1]["step"])
        assert resumed and resumed[-1] >= first_step
        # No checkpoint or metric lost: one validation per 10 steps up to the last, each exactly once.
        assert [h["step"] for h in history if "valid_bleu" in h] == list(range(10, steps + 1, 10))

        runs = client.search_runs([experiment])
        assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
        parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags and r.info.status == "FINISHED")
        assert {"test_bleu_src2tgt", "test_bleu_tgt2src"} <= set(parent.data.metrics)
        trains = [r for r in runs if r.data.tags.get(STAGE_TAG) == "train"]
        assert sorted(r.info.status for r in trains) == ["FAILED", "FINISHED"], [r.info.status for r in trains]
        train_run = next(r for r in trains if r.info.status == "FINISHED")
        logged = {m.step for r in trains for m in client.get_metric_history(r.info.run_id, "train_total")}
        assert set(range(5, steps + 1, 5)) <= logged  # the two runs together: every step logged
        assert [m.value for m in client.get_metric_history(train_run.info.run_id, "resumed_from_step")]
        assert client.list_artifacts(train_run.info.run_id)  # artifacts went through the server to shared storage
        assert any((shared / "mlflow" / "artifacts").rglob("model.pt"))
    finally:
        head.main(["stop"])
        cluster.shutdown()


class FakeServer:
    pid = 424242


def test_head_binds_the_advertised_private_address_and_warns_on_every_interface(tmp_path, monkeypatch, capsys):
    """MLflow listens where workers reach it (the node's private address), not on 0.0.0.0 unless asked."""
    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    monkeypatch.setattr(head, "node_address", lambda: "10.0.0.5")
    monkeypatch.setattr(head, "gcs_address", lambda address: "")  # no Ray to follow: no watcher
    monkeypatch.setattr(head.probe, "port_taken", lambda host, port: None)  # the server is faked: so is its port
    bound = []
    monkeypatch.setattr(head, "start_mlflow", lambda *args, **kwargs: bound.append(args[2]) or FakeServer())
    assert head.main(["start", "--shared", str(tmp_path / "shared")]) == 0
    assert bound == ["10.0.0.5"] and "WARNING" not in capsys.readouterr().err
    info = json.loads((tmp_path / "cluster.json").read_text())
    assert (info["tracking_uri"], info["mlflow_host"], info["mlflow_auth"]) == ("http://10.0.0.5:5000", "10.0.0.5", "")
    assert head.main(["start", "--shared", str(tmp_path / "shared"), "--host", "0.0.0.0"]) == 0
    assert bound[-1] == "0.0.0.0" and "WARNING: mlflow server listens on every interface" in capsys.readouterr().err


def test_head_auth_takes_the_admin_password_from_a_file_or_the_environment_only(tmp_path, monkeypatch):
    """--auth: basic-auth app, password by environment to the server; neither the auth config nor the
    cluster file holds it (the server is faked here; the next test starts a real one)."""
    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    monkeypatch.delenv(head.ADMIN_PASSWORD_ENV, raising=False)
    monkeypatch.setattr(head.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(head, "gcs_address", lambda address: "")
    monkeypatch.setattr(head.probe, "port_taken", lambda host, port: None)  # the server is faked: so is its port
    started = []
    monkeypatch.setattr(head, "start_mlflow", lambda *args, **kwargs: started.append(kwargs) or FakeServer())
    shared = tmp_path / "shared"
    common = ["start", "--shared", str(shared), "--advertise", "10.0.0.5", "--auth"]
    with pytest.raises(SystemExit, match="admin password"):
        head.main(common)
    (tmp_path / "password").write_text("tooshort10\n")
    with pytest.raises(SystemExit, match="has 10 characters, MLflow needs at least 12"):
        head.main(common + ["--admin-password-file", str(tmp_path / "password")])
    secret = "not-in-any-file-7"
    (tmp_path / "password").write_text(secret + "\n")
    assert head.main(common + ["--admin-password-file", str(tmp_path / "password")]) == 0
    monkeypatch.setenv(head.ADMIN_PASSWORD_ENV, secret)
    assert head.main(common) == 0
    assert [kwargs["password"] for kwargs in started] == [secret, secret]
    config = started[0]["auth_config"]
    assert "admin_username = admin" in config.read_text() and secret not in config.read_text()
    assert secret not in (tmp_path / "cluster.json").read_text()
    assert json.loads((tmp_path / "cluster.json").read_text())["mlflow_auth"] == "admin"


def test_mlflow_with_auth_refuses_anonymous_clients_and_tracks_for_the_admin(tmp_path, monkeypatch):
    """`--auth` for real: MLflow's basic-auth app started by cluster.head on loopback. Anonymous requests and a
    wrong password get 401; the pipeline's tracker, with the admin's credentials in MLflow's own environment
    variables (as `ray start` hands them to the workers, docs/cluster.md), records runs, metrics and an
    artifact through it."""
    import urllib.error
    import urllib.request

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline.config import TrackingConfig
    from pipeline.tracking.runs import Tracker

    port = free_port()
    secret = "s3cret-for-this-test-only"
    # Advertised by a public address (TEST-NET-3): MLflow 3's default Host check refused those; the
    # start's health probe names the server that way, so it would have failed here.
    server = head.start_mlflow(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "artifacts"), "127.0.0.1", port,
                               tmp_path / "server.log", auth_config=head.write_auth_config(tmp_path / "auth"),
                               password=secret, advertise="203.0.113.7")
    url = f"http://127.0.0.1:{port}"
    try:
        session = subprocess.run(["ps", "-o", "args=", "-s", str(server.pid)], capture_output=True, text=True).stdout
        assert "huey" not in session and "_job_runner" not in session, session  # MLflow's job execution is off
        with pytest.raises(urllib.error.HTTPError) as refused:  # any other name still is (never `*`)
            urllib.request.urlopen(urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1",
                                                          headers={"Host": f"evil.example:{port}"}), timeout=10)
        assert refused.value.code == 403 and b"Invalid Host header" in refused.value.read()
        assert head.allowed("203.0.113.7", port) == (
            f"203.0.113.7,203.0.113.7:{port},localhost,localhost:{port},127.0.0.1,127.0.0.1:{port}",
            f"http://203.0.113.7:{port},http://localhost:{port},http://127.0.0.1:{port}")
        for user, password in [(None, None), ("admin", "wrong")]:
            request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
            if user:
                request.add_unredirected_header("Authorization", "Basic " + __import__("base64").b64encode(
                    f"{user}:{password}".encode()).decode())
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 401, (user, refused.value.code)

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", head.ADMIN_USERNAME)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
        report = tmp_path / "stage" / "report.json"
        report.parent.mkdir()
        report.write_text("{}")
        (report.parent / "manifest.json").write_text(json.dumps({"config": {"data": {"limit": 7}}}))
        tracker = Tracker(TrackingConfig(enabled=True, uri=url, experiment="auth"), tmp_path, {"model": {"d": 8}})
        tracker.begin_stage("ingest")
        tracker.end_stage(report.parent, {"rows": 3}, [report])
        tracker.close()
        client = MlflowClient(url)
        runs = {r.data.tags[STAGE_TAG]: r for r in client.search_runs([client.get_experiment_by_name("auth").experiment_id])}
        assert {name: r.info.status for name, r in runs.items()} == {"pipeline": "FINISHED", "ingest": "FINISHED"}
        assert runs["ingest"].data.metrics == {"rows": 3.0} and runs["pipeline"].data.params == {"model.d": "8"}
        assert runs["ingest"].data.params == {"data.limit": "7"}
        assert [a.path for a in client.list_artifacts(runs["ingest"].info.run_id)] == ["report.json"]

        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        with pytest.raises(MlflowException, match="401|Unauthorized|credentials"):
            MlflowClient(url).search_experiments()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)  # leave nothing behind, then fail
            raise


def write_cluster_file(tmp_path: Path, pid: int, backend: str = "sqlite:////mnt/shared/duplex/mlflow/mlflow.db") -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"ray_address": "auto", "tracking_uri": "http://10.0.0.5:5000", "shared_dir": "/x",
                                "mlflow_pid": pid, "backend_store_uri": backend}))
    return path


def test_head_stop_never_signals_a_process_that_is_not_its_mlflow_server(tmp_path, monkeypatch):
    """A stale cluster file's PID now names another process (its own session leader, as the server was):
    `stop` must leave it alone, say so, exit 1 and keep the file."""
    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        path = write_cluster_file(tmp_path, bystander.pid)
        assert head.main(["stop"]) == 1
        time.sleep(0.2)
        assert bystander.poll() is None, "stop signalled a process that is not the mlflow server"
        assert path.is_file()
    finally:
        bystander.kill()
        bystander.wait()
    assert head.main(["stop"]) == 0  # now nothing runs under that PID: the stale file is removed
    assert not path.exists()


def test_the_head_server_and_cluster_file_end_when_the_heads_ray_does(tmp_path, monkeypatch):
    """After `ray down` the MLflow server used to keep running and the cluster file to stay. `watch` (started
    by `start`) stops the server and removes the file once the GCS refuses connections; it leaves a server
    that a newer `start` recorded alone. A stand-in server: a process whose command line is `mlflow server`
    on the file's backend store, as `stop` checks."""
    import threading

    monkeypatch.setenv(connect.CLUSTER_FILE_ENV, str(tmp_path / "cluster.json"))
    backend = f"sqlite:///{tmp_path}/mlflow.db"
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen()
    address = f"127.0.0.1:{gcs.getsockname()[1]}"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "mlflow", "server", backend],
                              start_new_session=True)
    try:
        path = write_cluster_file(tmp_path, server.pid, backend)
        result = []
        watcher = threading.Thread(target=lambda: result.append(
            head.main(["watch", "--gcs", address, "--interval", "0.2", "--misses", "3"])))
        watcher.start()
        time.sleep(1.5)
        assert watcher.is_alive() and server.poll() is None  # Ray answers: nothing happens
        gcs.close()  # `ray stop`
        watcher.join(timeout=10)
        assert result == [0] and server.wait(timeout=10) is not None and not path.exists()
    finally:
        server.kill()
        server.wait()
    # A newer `start` took over (another pid in the file): the old watcher leaves without signalling anything.
    path = write_cluster_file(tmp_path, os.getpid(), backend)
    monkeypatch.setattr(head, "reachable", lambda address: True)
    watcher = threading.Thread(target=lambda: result.append(head.main(["watch", "--gcs", address, "--interval", "0.1"])))
    watcher.start()
    time.sleep(0.3)
    path.write_text(json.dumps({**json.loads(path.read_text()), "mlflow_pid": 1}))
    watcher.join(timeout=10)
    assert result == [0, 0] and path.exists()


def test_a_local_run_keeps_rays_files_in_the_users_own_directory_not_tmp_ray(tmp_path, monkeypatch):
    """A local run's Ray used the machine-wide /tmp/ray (whoever made it first owns it). Now
    <system temp>/duplex-<uid>, mode 700, and refused when it is not this user's own; $RAY_TMPDIR wins."""
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(__import__("tempfile"), "tempdir", None)  # gettempdir() reads TMPDIR again
    own = connect.local_ray_tmpdir()
    assert own == tmp_path / f"duplex-{os.getuid()}" and (own.stat().st_mode & 0o777) == 0o700
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "mine"))
    assert connect.local_ray_tmpdir() == tmp_path / "mine"
    monkeypatch.delenv("RAY_TMPDIR")
    own.rmdir()
    (tmp_path / "elsewhere").mkdir()
    own.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ClusterError, match=rf"{own} is not this user's own directory"):
        connect.local_ray_tmpdir()
    if os.getuid() == 0:  # a directory of another user (root can make one)
        own.unlink()
        own.mkdir()
        os.chown(own, 4321, 4321)
        with pytest.raises(ClusterError, match="not this user's own directory"):
            connect.local_ray_tmpdir()


def test_a_workers_ray_stops_once_the_heads_is_gone(tmp_path, monkeypatch):
    """`ray down` stops the head's Ray only (the local provider): `cluster.worker watch` runs `ray stop` on its
    node once the head's GCS has refused connections `--misses` times, not while it answers; a second
    watcher replaces the first (pid file). `ray stop` is recorded here, not run: it would end every Ray of
    this user on the machine (the real one runs on the worker host of tests/cluster/test_ray_up.py)."""
    import threading

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    stopped = []
    monkeypatch.setattr(worker.subprocess, "run", lambda argv, **kwargs: stopped.append(argv) or
                        subprocess.CompletedProcess(argv, 0, "Stopped all 5 Ray processes.", ""))
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen()
    address = f"127.0.0.1:{gcs.getsockname()[1]}"
    result = []
    watcher = threading.Thread(target=lambda: result.append(
        worker.main(["watch", "--gcs", address, "--interval", "0.2", "--misses", "3"])))
    watcher.start()
    time.sleep(1.5)
    assert watcher.is_alive() and stopped == [] and worker.pid_file().read_text() == str(os.getpid())
    gcs.close()  # the head's `ray stop`
    watcher.join(timeout=10)
    assert result == [0] and [argv[-1] for argv in stopped] == ["stop"] and Path(stopped[0][0]).name == "ray"
    assert not worker.pid_file().exists()


def test_head_stop_recognises_its_server_by_command_line_and_backend_store():
    backend = "sqlite:////mnt/shared/duplex/mlflow/mlflow.db"
    ours = ["/usr/bin/python3", "-m", "mlflow", "server", "--backend-store-uri", backend, "--host", "10.0.0.5"]
    assert head.is_our_server(ours, backend)
    assert not head.is_our_server(ours, "sqlite:////elsewhere/mlflow.db")  # another cluster file's server
    assert not head.is_our_server(["sleep", "30"], backend)
    assert head.command_line(os.getpid())[:1] == [sys.executable] or "python" in head.command_line(os.getpid())[0]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_shipped_cluster_yamls_pass_the_security_checks(path, capsys, tmp_path, monkeypatch):
    """Dashboard on loopback (reached by `ray dashboard`), token auth on every `ray start`, nothing open."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token of this machine's (its mode is checked)
    text = path.read_text(encoding="utf-8")
    assert "--dashboard-host=127.0.0.1" in text
    assert not [line for line in text.splitlines() if "0.0.0.0" in line.split("#", 1)[0]]
    assert check.security_findings(check.validate(load(path)), text) == []
    assert check.check(path) == 3  # valid, placeholders left
    assert "INSECURE" not in capsys.readouterr().out


def break_security(config: dict, breakage: str) -> str:
    """Make one security breach in a loaded shipped YAML; return the key the finding must name."""
    if breakage == "ssh_open_to_world":
        config["provider"]["security_group"]["IpPermissions"][0]["IpRanges"][0]["CidrIp"] = "0.0.0.0/0"
        return "provider.security_group.IpPermissions[0].IpRanges[0].CidrIp"
    if breakage == "port_open_to_world_ipv6":
        config["provider"]["security_group"]["IpPermissions"].append(
            {"FromPort": 8265, "ToPort": 8265, "IpProtocol": "tcp", "Ipv6Ranges": [{"CidrIpv6": "::/0"}]})
        return "provider.security_group.IpPermissions[1].Ipv6Ranges[0].CidrIpv6"
    if breakage in ("head_without_token", "worker_without_token"):
        key = f"{breakage.split('_')[0]}_start_ray_commands"
        config[key] = [c.replace("RAY_AUTH_MODE=token ", "") if "ray start" in c else c for c in config[key]]
        return key
    if breakage == "no_head_start_commands":
        config["head_start_ray_commands"] = []
        return "head_start_ray_commands"
    if breakage == "dashboard_on_every_interface":
        config["head_start_ray_commands"] = [c.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0")
                                             for c in config["head_start_ray_commands"]]
        return "head_start_ray_commands"
    if breakage == "token_readable_by_others":
        return "file_mounts.~/.ray/auth_token"
    assert breakage == "mlflow_on_every_interface"
    config["head_start_ray_commands"] = [c + " --host 0.0.0.0" if "cluster.head start" in c else c
                                         for c in config["head_start_ray_commands"]]
    return "head_start_ray_commands"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
@pytest.mark.parametrize("breakage", ["ssh_open_to_world", "port_open_to_world_ipv6", "head_without_token",
                                      "worker_without_token", "no_head_start_commands",
                                      "dashboard_on_every_interface", "mlflow_on_every_interface",
                                      "token_readable_by_others"])
def test_insecure_copies_fail_the_check_with_one_line_per_finding(path, breakage, tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"  # the token `ray get-auth-token --generate` (or a local Ray) wrote, mode 600 or 644
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    (home / ".ray" / "auth_token").chmod(0o644 if breakage == "token_readable_by_others" else 0o600)
    monkeypatch.setenv("HOME", str(home))
    config = load(path)
    if "security_group" not in config["provider"] and "open" in breakage:
        pytest.skip("the local provider has no security group (the firewall is yours)")
    key = break_security(config, breakage)
    target = tmp_path / path.name
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    assert check.validate(load(target))  # still valid for Ray: only the security rules catch it
    assert check.check(target) == 1
    findings = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{target}:")
                and "fix:" in line]
    assert len(findings) == 1 and f": {key}: " in findings[0], findings
    assert int(findings[0].split(":")[1]) > 0  # names the line
