"""`ray up`, `ray dashboard`, `ray exec`, `ray job submit` and `ray down` for real, across two hosts, as
docs/cluster.md tells a user to: the block of commands under "A head and a worker" in that file is read
from it and run line by line, from this machine's own namespaces as from a laptop.

The two hosts are built on this machine (tests/cluster/hosts.py): each its own network namespace on a
private bridge (10.213.0.1 the head, 10.213.0.2 the worker, no route out), PID namespace, /tmp (holding a
/tmp/ray made 755 by root, as a root launcher leaves it on a fresh machine), home directory and host name,
with an sshd that lets in only a throwaway user (`duplex-rayup`) with a throwaway key. The commands' own
side (`~/.ray/auth_token`, `~/.ssh/id_ed25519`, the launcher's Ray directory) gets a throwaway HOME and
RAY_TMPDIR. Root is needed (namespaces, useradd, ACLs): CI is root; elsewhere the test skips saying why,
but under CI=true it fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pipeline.tracking.store import STAGE_TAG
from tests.checkpoints import registered_checkpoints
from tests.cluster.hosts import (NICENESS, OPERATOR_IP, REPO_ROOT, Hosts, answers, in_cpu_group, remove_leftovers,
                                 unavailable)

DOC = REPO_ROOT / "docs" / "cluster.md"
MARKER = "<!-- ray-up-two-hosts:"
USER = "duplex-rayup"
DASHBOARD = 8265  # `ray dashboard`'s local end, on this machine's loopback
DRILL_STEPS = 50  # the host-loss drill's training run (the doc's smoke run has 30: a train stage of its own)
DRILL_TIMEOUT_S = 10  # its train.start_timeout_s: each placement of the group waits this long for the lost host
STOP_STEPS = 1000  # the `ray job stop` drill's training run, stopped long before its end
STOP_S = 10  # what a stopped job's driver may take to close its MLflow runs and end
# `ray job stop ADDRESS JOB`'s request through the Jobs SDK (which the CLI calls), then its wait for the job's end
STOP_JOB = """
import sys, time
from ray.job_submission import JobStatus, JobSubmissionClient
client = JobSubmissionClient(sys.argv[1])
print(f"asked {time.time()!r}", flush=True)
assert client.stop_job(sys.argv[2]), "stop_job: the job was not running"
deadline = time.monotonic() + 150
while (status := client.get_job_status(sys.argv[2])) not in {JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED}:
    assert time.monotonic() < deadline, status
    time.sleep(0.2)
print(f"status {status}")
"""
# Seconds per command, by the first name that occurs in it.
TIMEOUT_S = {"get-auth-token": 60, "cluster.onprem": 60, "ray up": 300, "nodes --wait": 360, "ray exec": 900,
             "ray job submit": 900, "ray down": 120}  # the hosts run at a lower priority than the suite beside them

pytestmark = pytest.mark.slow


def doc_commands(text: str) -> list[str]:
    """The commands of the fenced block right after the marker comment in docs/cluster.md."""
    after = text[text.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.DOTALL)
    assert block and after.index("```") == block.start(), "the marker must sit right above its ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def verb(command: str) -> str:
    """`ray`'s subcommand in a doc command (after an environment assignment, if any)."""
    words = command.split()
    return words[1] if words[0] == "ray" else words[2]


def test_the_doc_block_is_the_documented_path():
    """What the real test below runs: the two-host path, from the token to `ray down`."""
    commands = doc_commands(DOC.read_text(encoding="utf-8"))
    assert commands[0].startswith("RAY_AUTH_MODE=token ray get-auth-token --generate")
    assert "--worker" in commands[1] and "cluster.onprem" in commands[1]
    assert [verb(c) for c in commands[2:]] == ["up", "dashboard", "exec", "exec", "job", "job", "down"]
    assert commands[3].endswith("&") and "nodes --wait 2" in commands[4]
    assert "STRICT_SPREAD" in commands[5] and "STRICT_SPREAD" in commands[6]
    assert "run_pipeline.py tune" in commands[-2] and "--working-dir ." in commands[-2]


@pytest.fixture(scope="session")
def machine():
    """The two hosts and the operator's side; yields (env for the doc's commands, Hosts, operator dir)."""
    reason = unavailable() or (f"port {DASHBOARD} of 127.0.0.1 is taken (`ray dashboard` forwards it)"
                               if answers("127.0.0.1", DASHBOARD) else "")
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the ray up test: {reason}")
        pytest.skip(reason)
    remove_leftovers(USER)
    subprocess.run(["userdel", "--force", USER], capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="duplex-rayup-"))
    base.chmod(0o755)
    hosts = Hosts(base, USER)
    operator = base / "operator"
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a CI timeout still runs the clean-up below
    try:
        (operator / ".ssh").mkdir(parents=True, mode=0o700)
        (operator / "ray-tmp").mkdir()
        key = operator / ".ssh" / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "duplex-rayup-test", "-f", str(key)],
                       check=True, capture_output=True)
        hosts.create(key.with_suffix(".pub"))
        for host in hosts.hosts.values():
            hosts.start(host)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "DUPLEX_", "PYTEST_"))}
        env.update(HOME=str(operator), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   SSH_USER=USER, HEAD_IP=hosts.hosts["head"].address, WORKER_IP=hosts.hosts["worker"].address,
                   SHARED=str(hosts.shared), CLUSTER_YAML=str(base / "onprem.yaml"), PYTHONUNBUFFERED="1",
                   RAY_TMPDIR=str(operator / "ray-tmp"))  # the launcher's lock and state files
        yield env, hosts, operator
    finally:
        hosts.close()
        subprocess.run(["rm", "-rf", str(base)], capture_output=True)
        signal.signal(signal.SIGTERM, previous_term)


def mlflow_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, max_results=1000)


class Scenario:
    """The doc's commands in order, each checked for exit 0. The first test runs them up to the dashboard
    tunnel and leaves the rest to a background thread, so that the rest of the suite runs beside them
    (tests/conftest.py orders the two tests: first, and last but the wall-clock-limited ones): a join with a
    wrong token, the pipeline runs and the sweep, then what the second test asserts is read from the head's
    MLflow server and the shared storage, then `ray down` and what of either host is left after it. The
    second test waits for that thread and asserts."""

    def __init__(self, env: dict[str, str], hosts: Hosts, operator: Path):
        self.env, self.hosts, self.operator = env, hosts, operator
        self.commands = doc_commands(DOC.read_text(encoding="utf-8"))
        self.outputs: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.error = ""
        self.process: subprocess.Popen | None = None
        self.tunnel: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.rogue: dict[str, str] = {}  # what a `ray start` with a wrong token / none printed on the worker host
        self.runs: list = []  # the head's MLflow runs before `ray down`
        self.reports: dict[str, dict] = {}  # the train stage's report.json, by stage directory
        self.drill: dict = {}  # the host-loss drill (`lose_the_worker`)
        self.stopped: dict = {}  # `ray job stop` on a training job (`stop_a_job`)
        self.left: dict[str, list[str]] | None = None  # each host's processes after `ray down`
        self.cluster_file_left = True

    def fail(self, message: str) -> None:
        self.error = self.error or message  # the first failure is the one to show

    def run(self, command: str) -> None:
        """Run one doc command; its output goes to `outputs`, a failure to `error`. A command ending in `&`
        (the dashboard tunnel) stays in the background once its local port answers."""
        if command.endswith("&"):
            self.tunnel = subprocess.Popen(["bash", "-c", command[:-1]], cwd=REPO_ROOT, env=self.env, text=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
            deadline = time.monotonic() + 60
            while not answers("127.0.0.1", DASHBOARD):
                if self.tunnel.poll() is not None or time.monotonic() > deadline:
                    return self.fail(f"{command}: the tunnel did not open 127.0.0.1:{DASHBOARD}")
                time.sleep(0.5)
            return
        limit = next(seconds for name, seconds in TIMEOUT_S.items() if name in command)
        started = time.monotonic()
        self.process = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=self.env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = self.process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            output, _ = self.process.communicate()
            self.fail(f"{command}: still running after {limit} s\n{output[-4000:]}")
            return
        self.outputs[command] = output
        self.seconds[command] = round(time.monotonic() - started, 1)  # no print: other tests' capture would take it
        if self.process.returncode:
            self.fail(f"{command}: exit {self.process.returncode}\n{output[-6000:]}{self.head_logs()}")

    def head_logs(self) -> str:
        """The tails of the head's autoscaler logs (they say why a worker did not join), read through the
        head's own view of its /tmp."""
        init = self.hosts.hosts["head"].init_pid()
        if init is None:
            return ""
        logs = sorted(Path(f"/proc/{init}/root/tmp").glob("duplex-*/ray/session_2*/logs/monitor.*"))
        return "".join(f"\n--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)

    def run_all(self, commands: list[str]) -> None:
        for command in commands:
            if self.error:
                return
            self.run(command)
            if "nodes --wait" in command and not self.error:
                self.join_with_a_wrong_token()

    def join_with_a_wrong_token(self) -> None:
        """Machines of the cluster's network without the token try to join: `ray start` on the worker host,
        a Ray directory of its own, once with a made-up token and once with none at all (no RAY_AUTH_MODE, a
        home without ~/.ray/auth_token: a node set up without the cluster's auth); the head must refuse both."""
        worker, head = self.hosts.hosts["worker"], self.hosts.hosts["head"]
        start = (f"timeout 90 ~/duplex/.venv/bin/ray start --address={head.address}:6379 --num-cpus=1 "
                 "--temp-dir=/tmp/duplex-rogue/ray")
        for name, command in [("wrong", f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={'0' * 64} {start}"),
                              ("none", f"mkdir -p /tmp/duplex-rogue/home && env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN "
                                       f"HOME=/tmp/duplex-rogue/home {start}")]:
            done = subprocess.run(["ssh", "-i", str(self.operator / ".ssh" / "id_ed25519"), "-o", "BatchMode=yes",
                                   "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                                   f"{USER}@{worker.address}", command], capture_output=True, text=True, timeout=150)
            self.rogue[name] = f"exit {done.returncode}\n{done.stdout}{done.stderr}"

    def after_tunnel(self, commands: list[str]) -> None:
        """The background thread: the commands before `ray down`, the MLflow runs and the train report,
        `ray down` (always: the cluster must not outlive a failure) and what is left after it."""
        try:
            self.run_all(commands[:-1])
            if not self.error:
                info = json.loads((self.hosts.hosts["head"].home / ".duplex" / "cluster.json").read_text())
                self.runs = mlflow_runs(info["tracking_uri"])
                for report in (self.hosts.shared / "duplex" / "runs" / "smoke").glob("train-*/report.json"):
                    self.reports[report.parent.name] = json.loads(report.read_text(encoding="utf-8"))
            if not self.error:
                self.lose_the_worker()
            if not self.error:
                self.stop_a_job()
        except Exception as error:  # reported by the second test
            self.fail(f"reading the head's MLflow runs and the train report, or the host-loss drill: {error!r}")
        self.down(commands[-1])

    def lose_the_worker(self) -> None:
        """A machine lost for good mid-training: a training run across both hosts (more steps than the
        doc's, so a new train stage) loses the worker host after its first registered checkpoint (every process of
        the host SIGKILLed at once), and the host stays down. The stage must stop in bounded time (Ray's node-death
        detection, then two placements of DRILL_TIMEOUT_S) with the message docs/cluster.md shows, its checkpoints
        kept. Then a replacement machine comes up at the lost one's address (its /tmp empty), the head's autoscaler
        starts its Ray over SSH (the doc's `nodes --wait 2` waits for it), and the same command, run again as the
        message says, resumes from the checkpoint on both hosts. The second test asserts what the runs hold."""
        command = ('ray exec "$CLUSTER_YAML" \'cd ~/duplex && python run_pipeline.py --config configs/smoke.yaml '
                   f'--stages train train.placement_strategy=STRICT_SPREAD train.max_steps={DRILL_STEPS} '
                   f'train.max_failures=1 train.start_timeout_s={DRILL_TIMEOUT_S}\'')
        runs = self.hosts.shared / "duplex" / "runs" / "smoke" / "ray_results"
        before = set(runs.glob("*/checkpoint_manager_snapshot.json"))
        started = time.monotonic()
        driver = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=self.env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = driver
        worker = self.hosts.hosts["worker"]
        try:
            while driver.poll() is None and time.monotonic() - started < 900:
                snapshots = set(runs.glob("*/checkpoint_manager_snapshot.json")) - before
                checkpoints = registered_checkpoints(next(iter(snapshots))) if snapshots else []
                if checkpoints:
                    self.drill["checkpoint_step"] = int(json.loads(
                        (checkpoints[0] / "history.json").read_text(encoding="utf-8"))[-1]["step"])
                    worker.lose()
                    started = time.monotonic()
                    break
                time.sleep(0.5)
            output, _ = driver.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            output, _ = driver.communicate()
        self.drill.update(lost=output, lost_exit=driver.returncode,
                          stopped_after_s=round(time.monotonic() - started, 1))
        if "checkpoint_step" not in self.drill:
            self.fail(f"the host-loss drill: the run ended before its first checkpoint\n{output[-3000:]}")
            return
        # The replacement machine, its Ray started by the head's autoscaler, then the same command again.
        self.hosts.start(worker)
        self.run(next(c for c in self.commands if "nodes --wait" in c))
        again = time.monotonic()
        if not self.error:
            self.run(command)
        self.drill["resumed_s"] = round(time.monotonic() - again, 1)
        if self.error:
            return
        info = json.loads((self.hosts.hosts["head"].home / ".duplex" / "cluster.json").read_text())
        self.runs = mlflow_runs(info["tracking_uri"])
        for report in (self.hosts.shared / "duplex" / "runs" / "smoke").glob("train-*/report.json"):
            self.reports.setdefault(report.parent.name, json.loads(report.read_text(encoding="utf-8")))

    def stop_a_job(self) -> None:
        """`ray job stop` on a training job once it registered a checkpoint (its request through the Jobs SDK, as
        the CLI sends it): Ray sends the job's driver SIGTERM (and SIGKILL after the head's RAY_JOB_STOP_WAIT_TIME_S).
        Keeps when the stop was asked, what the stop and the job's logs said, and the head's MLflow runs after it."""
        job = "duplex-stop-drill"
        address = f"--address http://127.0.0.1:{DASHBOARD}"
        runs = self.hosts.shared / "duplex" / "runs" / "smoke" / "ray_results"
        before = set(runs.glob("*/checkpoint_manager_snapshot.json"))
        submit = (f"RAY_AUTH_MODE=token ray job submit {address} --no-wait --submission-id {job} --working-dir . -- "
                  f"python run_pipeline.py --config configs/smoke.yaml --stages train train.max_steps={STOP_STEPS} "
                  "train.placement_strategy=STRICT_SPREAD")
        done = subprocess.run(["bash", "-c", submit], cwd=REPO_ROOT, env=self.env, text=True, capture_output=True,
                              timeout=300)
        if done.returncode:
            return self.fail(f"{submit}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        deadline = time.monotonic() + 600
        while not any(registered_checkpoints(snapshot)
                      for snapshot in set(runs.glob("*/checkpoint_manager_snapshot.json")) - before):
            if time.monotonic() > deadline:
                return self.fail(f"the job {job} registered no checkpoint in 600 s{self.head_logs()}")
            time.sleep(0.5)
        # Asked through the Jobs SDK that `ray job stop` calls, timed from the request itself: the CLI's own start
        # (importing Ray's command line: 4.7 s on an idle 2-core box, over 8 s beside the suite) is not the driver's.
        stop = subprocess.run([sys.executable, "-c", STOP_JOB, f"http://127.0.0.1:{DASHBOARD}", job], cwd=REPO_ROOT,
                              env={**self.env, "RAY_AUTH_MODE": "token"}, text=True, capture_output=True, timeout=180)
        asked = re.search(r"^asked (\S+)$", stop.stdout, re.MULTILINE)
        if stop.returncode or not asked:
            return self.fail(f"the stop of {job}: exit {stop.returncode}\n{stop.stdout[-3000:]}{stop.stderr[-3000:]}")
        self.stopped["asked"] = float(asked.group(1))
        self.stopped["stop_s"] = round(time.time() - self.stopped["asked"], 1)
        logs = subprocess.run(["bash", "-c", f"RAY_AUTH_MODE=token ray job logs {address} {job}"], cwd=REPO_ROOT,
                              env=self.env, text=True, capture_output=True, timeout=120)
        self.stopped.update(stop=f"exit {stop.returncode}\n{stop.stdout}{stop.stderr}", logs=logs.stdout)
        info = json.loads((self.hosts.hosts["head"].home / ".duplex" / "cluster.json").read_text())
        self.stopped["runs"] = mlflow_runs(info["tracking_uri"])

    def down(self, command: str) -> None:
        """`ray down`, the tunnel stopped, and what is left on either host (their sshd aside)."""
        self.run(command)
        self.stop_tunnel()
        deadline = time.monotonic() + 60  # Ray, the MLflow server, its watcher and the SSH sessions end
        while any(h.processes() for h in self.hosts.hosts.values()) and time.monotonic() < deadline:
            time.sleep(1)
        self.left = {name: host.processes() for name, host in self.hosts.hosts.items()}
        self.cluster_file_left = (self.hosts.hosts["head"].home / ".duplex" / "cluster.json").exists()

    def stop_tunnel(self) -> None:
        if self.tunnel is not None and self.tunnel.poll() is None:
            os.killpg(self.tunnel.pid, signal.SIGTERM)
            self.tunnel.wait(timeout=20)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=30)
        self.stop_tunnel()


@pytest.fixture(scope="session")
def scenario(machine):
    scenario = Scenario(*machine)
    yield scenario
    scenario.stop()


def started(scenario: Scenario) -> None:
    """Up to the dashboard tunnel here, then the rest in the background (once)."""
    if scenario.thread is not None:
        return
    tunnel = next(i for i, c in enumerate(scenario.commands) if c.endswith("&")) + 1
    scenario.run_all(scenario.commands[:tunnel])
    scenario.thread = threading.Thread(target=scenario.after_tunnel, args=(scenario.commands[tunnel:],), daemon=True)
    if not scenario.error:
        scenario.thread.start()
    else:  # `ray down` all the same: a half-started cluster must not outlive the test
        scenario.down(scenario.commands[-1])


def test_ray_up_starts_the_head_as_the_docs_say(scenario, machine):
    """The token, the filled YAML, `ray up`, the tunnel: the head's Ray (in the SSH user's own directory,
    not /tmp/ray), its MLflow server and the cluster file; no route out of either host."""
    _, hosts, _ = machine
    started(scenario)
    assert not scenario.error, scenario.error
    head = hosts.hosts["head"]
    info = json.loads((head.home / ".duplex" / "cluster.json").read_text(encoding="utf-8"))
    assert info["tracking_uri"] == f"http://{head.address}:5000"
    assert info["shared_dir"] == f"{hosts.shared}/duplex" and info["ray_address"] == f"{head.address}:6379"
    assert oct(Path(scenario.env["HOME"], ".ray", "auth_token").stat().st_mode & 0o777) == oct(0o600)
    root = Path(f"/proc/{head.init_pid()}/root")  # the head's own view of the file system (its /tmp)
    uid = hosts.uid()
    sessions = [d for d in (root / f"tmp/duplex-{uid}/ray").glob("session_2*") if (d / "logs").is_dir()]
    assert sessions, list((root / "tmp").rglob("*"))[:20]
    assert list((root / "tmp" / "ray").iterdir()) == []  # the 755 root-owned /tmp/ray: nothing of Ray's in it
    for host in hosts.hosts.values():
        routes = subprocess.run(["ip", "-n", host.netns, "route"], capture_output=True, text=True).stdout
        assert "default" not in routes and OPERATOR_IP not in routes.replace(f"{host.address}", ""), routes
    # Below the suite: every process of both hosts (Ray's, the SSH logins') in their CPU cgroup (hosts.py, CPU_SHARE)
    if hosts.cpu_procs is None:
        print("no CPU cgroup could be made: the hosts run at nice", NICENESS, "only (ineffective under autogroups)")
    else:
        outside = []
        for host in hosts.hosts.values():
            for pid in [host.init_pid(), *(int(line.split()[0]) for line in host.processes())]:
                with contextlib.suppress(OSError):  # ended meanwhile
                    if not in_cpu_group(pid):
                        outside.append(pid)
        assert not outside, f"processes of the hosts outside their CPU cgroup: {outside}"


def test_two_hosts_train_together_and_ray_down_leaves_nothing(scenario, machine):
    """The worker joined with the token (a wrong one is refused); the shared-storage probe ran on both nodes;
    the smoke training ran one worker per host with DDP between them and both ranks' metrics reached the
    head's MLflow server; the Ray job skipped the first run's stages; the sweep was tracked; a training run
    that lost the worker host for good stopped in bounded time saying what to do, and run again on a replacement
    machine resumed from its checkpoint, lost no step and left no RUNNING run; `ray job stop` on a training job
    ended its driver, which closed its runs KILLED within STOP_S;
    `ray down` left no process on either host."""
    _, hosts, _ = machine
    started(scenario)
    assert not scenario.error, f"the first test's commands failed: {scenario.error}"
    scenario.thread.join(timeout=sum(TIMEOUT_S.values()) + 300)
    assert not scenario.thread.is_alive(), "the background commands did not finish"
    assert not scenario.error, scenario.error
    commands, outputs = scenario.commands, scenario.outputs
    head, worker = hosts.hosts["head"].address, hosts.hosts["worker"].address
    listing = outputs[next(c for c in commands if "nodes --wait" in c)]
    assert re.search(rf"^{re.escape(head)}\s+duplex-head\s.*\(head\)$", listing, re.MULTILINE), listing
    assert re.search(rf"^{re.escape(worker)}\s+duplex-worker\s", listing, re.MULTILINE), listing
    assert not scenario.rogue["wrong"].startswith("exit 0") and "InvalidAuthToken" in scenario.rogue["wrong"], \
        scenario.rogue["wrong"]
    assert not scenario.rogue["none"].startswith("exit 0"), scenario.rogue["none"]  # refused, or never let in (exit 124)
    print(f"a join without the token: {scenario.rogue['none'][:300]!r}")

    pipeline = next(c for c in commands if c.startswith("ray exec") and "run_pipeline.py" in c)
    job, tune = [c for c in commands if c.startswith("RAY_AUTH_MODE=token ray job submit")]
    for command in (pipeline, job):
        assert "cluster: 2 nodes see the workdir" in outputs[command], outputs[command][-3000:]
    for command in (job, tune):
        assert "succeeded" in outputs[command], outputs[command][-3000:]
    # The job's --working-dir is unpacked to a new directory: the first run's stages are found all the same.
    for stage in ("ingest", "spm", "tokenize", "teacher", "distill", "train"):
        assert re.search(rf"^  {stage}\s+skipped \(finished earlier\)", outputs[job], re.MULTILINE), \
            (stage, outputs[job][-3000:])
    assert re.search(r"^  evaluate\s+ran\b", outputs[job], re.MULTILINE)

    # One training worker per host, the ranks reaching each other (the placement went over the process group).
    (report,) = [r for name, r in scenario.reports.items() if r["steps"] != DRILL_STEPS]
    placed = {w["node_ip"]: w for w in report["workers"]}
    assert sorted(placed) == sorted([head, worker]), report["workers"]
    assert {placed[head]["hostname"], placed[worker]["hostname"]} == {"duplex-head", "duplex-worker"}
    # what the sweep said, and its trials.csv (status and error of each trial), shown if a trial's run lacks its BLEUs
    sweep_said = outputs[tune][-3000:] + "".join(
        f"\n{path}:\n{path.read_text(encoding='utf-8')}"
        for path in (hosts.shared / "duplex" / "runs" / "smoke").glob("tune-*/trials.csv"))
    check_mlflow(scenario.runs, rank_on_worker=placed[worker]["rank"], sweep_said=sweep_said)

    # The worker host lost for good mid-training: the stage stopped in bounded time saying what to do, its
    # checkpoints kept; the same command on a replacement machine resumed from the checkpoint and lost no step.
    drill = scenario.drill
    assert drill["lost_exit"] != 0, drill["lost"][-3000:]
    said = drill["lost"]
    assert (f"error: train: Ray Train could not place its 2 worker(s) within train.start_timeout_s={DRILL_TIMEOUT_S} "
            "s, 2 tries (a host lost for good?); its checkpoints are kept under") in said, said[-3000:]
    # Ray's node-death detection (~30 s), two placements of DRILL_TIMEOUT_S, the driver's end through `ray exec`.
    assert drill["stopped_after_s"] <= 150, drill["stopped_after_s"]
    (name,) = [name for name, r in scenario.reports.items() if r["steps"] == DRILL_STEPS]
    resumed = scenario.reports[name]
    assert resumed["restarts"] >= 1 and sorted(w["node_ip"] for w in resumed["workers"]) == sorted([head, worker])
    history = json.loads((hosts.shared / "duplex" / "runs" / "smoke" / name / "history.json").read_text())
    assert [h["resumed_from"] for h in history if "resumed_from" in h][0] >= drill["checkpoint_step"]
    assert [h["step"] for h in history if "valid_bleu" in h] == list(range(10, DRILL_STEPS + 1, 10))
    print(f"host lost for good after the checkpoint of step {drill['checkpoint_step']}; the stage stopped "
          f"{drill['stopped_after_s']} s later; run again on a replacement it took {drill['resumed_s']} s")

    # `ray job stop` on a training job: its driver closed its runs KILLED within STOP_S, and ended by itself.
    stopped = scenario.stopped
    assert stopped["stop"].startswith("exit 0"), stopped["stop"]
    assert "error: interrupted by SIGTERM; finished stages are kept" in stopped["logs"], stopped["logs"][-3000:]
    killed = [r for r in stopped["runs"] if r.info.status == "KILLED"]
    assert sorted(r.data.tags.get(STAGE_TAG) for r in killed) == ["pipeline", "train"], \
        [(r.info.run_name, r.info.status) for r in stopped["runs"]]
    assert all(r.data.tags["error"] == "Terminated: SIGTERM (signal 15)" for r in killed)
    assert not [r.info.run_name for r in stopped["runs"] if r.info.status == "RUNNING"]
    closed_after_s = max(r.info.end_time for r in killed) / 1000 - stopped["asked"]
    assert 0 < closed_after_s <= STOP_S, closed_after_s
    print(f"ray job stop: the runs were KILLED {closed_after_s:.1f} s after it was asked; the command took "
          f"{stopped['stop_s']} s")

    # `ray down`: Ray, the MLflow server, its watcher and the SSH sessions ended on both hosts.
    assert commands[-1].startswith("ray down") and commands[-1] in outputs
    assert scenario.left == {"head": [], "worker": []}, scenario.left
    assert not scenario.cluster_file_left
    for command, seconds in scenario.seconds.items():  # shown with -rA / -s
        print(f"{seconds:6.1f} s  {command}")


def check_mlflow(runs: list, rank_on_worker: int, sweep_said: str) -> None:
    """Both BLEUs of both pipeline runs and of every trial were in the head's server, with the throughput of
    the rank on the worker host; nothing was RUNNING."""
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    pipelines = [r for r in runs if re.fullmatch(r"smoke-pipeline-[0-9a-f]+", r.info.run_name or "")]
    evaluated = [r for r in pipelines if {"test_bleu_src2tgt", "test_bleu_tgt2src"} <= set(r.data.metrics)]
    assert len(evaluated) == 2, [(r.info.run_name, r.data.metrics) for r in pipelines]
    trains = [r for r in runs if r.data.tags.get(STAGE_TAG) == "train"]  # the job skipped its train stage
    # The host-loss drill's first run stopped (FAILED, its pipeline run too); run again, it resumed and FINISHED.
    (lost,) = [r for r in trains if r.info.status == "FAILED"]
    assert "resumed_from_step" not in lost.data.metrics
    (train,) = [r for r in trains if "resumed_from_step" not in r.data.metrics and r.info.status == "FINISHED"]
    assert {"tokens_per_s_rank0", f"tokens_per_s_rank{rank_on_worker}"} <= set(train.data.metrics), train.data.metrics
    (drill,) = [r for r in trains if "resumed_from_step" in r.data.metrics]
    assert drill.info.status == "FINISHED"
    failed = [r for r in pipelines if r.info.status == "FAILED"]
    assert len(failed) == 1 and len(pipelines) == 4, [(r.info.run_name, r.info.status) for r in pipelines]
    sweeps = [r for r in runs if re.fullmatch(r"smoke-tune-[0-9a-f]+", r.info.run_name or "")]
    assert len(sweeps) == 1
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweeps[0].info.run_id]
    assert len(trials) == 3
    for trial in trials:
        assert {"valid_bleu_src2tgt", "valid_bleu_tgt2src"} <= set(trial.data.metrics), \
            (trial.info.run_name, trial.info.status, trial.data.metrics, trial.data.tags, sweep_said)
    assert all(r.info.status == "FINISHED" for r in [*pipelines, *trains, *sweeps, *trials] if r not in (lost, *failed))
