"""pipeline.training.raytrain, the driver side: the resource check (on a local Ray), the run's storage, the progress bar over
rank 0's progress file, an elastic group's size and what a group that cannot be placed again says."""
import dataclasses
import json
import math
import struct
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.stage import StageError
from pipeline.training import raytrain, trainloop


def test_an_unsatisfiable_request_fails_fast_with_the_numbers(ray_session):
    with pytest.raises(StageError, match=r"GPU: need 2, cluster has 0.*use_gpu=false"):
        raytrain.check_resources(TrainConfig(num_workers=2, use_gpu=True), timeout_s=0.5)
    with pytest.raises(StageError, match=r"CPU: need 12, cluster has 2"):
        raytrain.check_resources(TrainConfig(num_workers=3, cpus_per_worker=4), timeout_s=0.5)
    raytrain.check_resources(TrainConfig(num_workers=2), timeout_s=0.5)  # fits: returns
    # One node of 2 CPUs: two workers fit, but not one per node (Ray Train would wait for a second node forever).
    with pytest.raises(StageError, match=r"nodes \(STRICT_SPREAD\): need 2, cluster has 1"):
        raytrain.check_resources(TrainConfig(num_workers=2, placement_strategy="STRICT_SPREAD"), timeout_s=0.5)


def test_the_instances_processes_reach_its_state_api_with_another_ray_on_the_machine(ray_session, tmp_path):
    """A CI run: the cluster test's Ray beside a fault run's, and the run's Ray Train PlacementGroupCleaner (no
    longer started: `raytrain.trainer_class`) died with "Found multiple active Ray instances" (an actor that asks
    the State API with no address finds its cluster by listing the machine's raylets). A local instance tells its
    processes where its State API is (cluster/connect.py `init_local`), so an actor asking as the cleaner did
    gets its answer."""
    import subprocess
    import sys

    import ray

    other = tmp_path / "raylet"  # another Ray on the machine, as Ray's discovery sees one: a raylet and its GCS
    other.symlink_to(sys.executable)
    raylet = subprocess.Popen([str(other), "-c", "import time; time.sleep(120)", "--gcs-address=192.0.2.9:6379"])
    try:
        @ray.remote(num_cpus=0)
        class Cleaner:
            def controller_state(self, actor_id: str) -> str:
                from ray.util.state import get_actor  # what Ray Train's cleaner calls, with no address

                return get_actor(actor_id, timeout=30).state

        cleaner = Cleaner.remote()
        controller = Cleaner.remote()
        assert ray.get(cleaner.controller_state.remote(controller._actor_id.hex()), timeout=120) == "ALIVE"
    finally:
        raylet.kill()
        raylet.wait()


def make_group(cpus: float) -> str:
    """A placement group of one bundle of `cpus` CPUs, made by the calling process (an actor: as a Ray Train
    controller makes its worker group's), once placed."""
    import ray
    from ray.util.placement_group import placement_group

    group = placement_group([{"CPU": cpus}])
    ray.get(group.ready(), timeout=60)
    return group.id.hex()


def _controller() -> Any:
    import ray

    return ray.remote(num_cpus=0)(type("Controller", (), {"make": lambda self, cpus: make_group(cpus)})).remote()


def wait_for_cpus(full: float, timeout_s: float = 30.0, explain: Callable[[], str] = lambda: "") -> None:
    """Wait up to `timeout_s` for the cluster's `full` CPUs to be free again; fails if they are not (with
    `explain()`, called only then)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < full and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == full, explain()


def test_a_placement_group_left_by_a_killed_actor_is_released(ray_session):
    """What a Tune trial stopped by its scheduler leaves behind: its Ray Train controller (an actor) made the worker
    group's placement group and was killed with the trial; Ray keeps such a group until the job ends."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    owner = _controller()
    ray.get(owner.make.remote(1.0), timeout=60)
    full = ray.cluster_resources()["CPU"]
    assert ray.available_resources().get("CPU", 0) <= full - 1
    assert raytrain.release_orphaned_groups(job) == 0  # its creator lives: kept
    ray.kill(owner)
    deadline = time.monotonic() + 30
    released = 0
    while not released and time.monotonic() < deadline:
        time.sleep(0.5)
        released = raytrain.release_orphaned_groups(job)
    assert released == 1
    wait_for_cpus(full, deadline - time.monotonic())


def test_a_group_registered_after_its_creator_was_killed_is_released(ray_session):
    """The sweep's held-CPU flake: `ray.kill` marks an actor DEAD in the GCS before its process stops, and a placement
    group it was creating right then is registered after that, without the `creator_actor_dead` flag the GCS
    sets only on the groups it holds at the death. Killed mid-loop, a group maker leaves such a group in about
    a third of the kills (bench/orphan_race.py); the release finds it by the actor table, and its count is every
    group the killed makers left, whenever each was registered."""
    import ray

    from bench.orphan_race import killed_maker_groups

    job = ray.get_runtime_context().get_job_id()
    raytrain.release_orphaned_groups(job)  # what earlier tests' dead actors left is not this test's to count
    makers = set()
    for _ in range(40):
        maker, left = killed_maker_groups(job)
        makers.add(maker)
        unflagged = [g for g in left if not g.creator_actor_dead]
        if unflagged:
            break
        raytrain.release_orphaned_groups(job)
    assert unflagged, "40 kills of a group maker left no unflagged group: the race was not reproduced"
    # every maker's, not the last one's alone: an earlier maker's group registered after the release that followed
    # its kill is still there, and is released (and counted) now
    orphans = [g for g in raytrain.job_groups(job) if g.creator_actor_id.hex() in makers]
    assert {g.placement_group_id for g in left} <= {g.placement_group_id for g in orphans}
    assert raytrain.release_orphaned_groups(job) == len(orphans)

    def still_there() -> list:
        return [g for g in raytrain.job_groups(job) if g.creator_actor_id.hex() in makers]

    deadline = time.monotonic() + 10
    while still_there() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not still_there()


def test_a_fit_whose_controller_died_fails_in_one_line_and_releases_its_group(ray_session, tmp_path, monkeypatch):
    """Ray Train's PlacementGroupCleaner (a process per run, not started: `trainer_class`) is what removed the group
    of a controller that died during a fit while the driver lives on (a test session, a Tune trial's driver):
    `fit_and_average` does it on the failure. The stand-in's fit is what Ray Train's does then: its controller made
    the group, died (killed here), and fit raised."""
    import ray
    from ray._private.state import state

    monkeypatch.setenv(raytrain.START_TIMEOUT_ENV, "60")
    full = ray.cluster_resources()["CPU"]
    controller = _controller()

    class Crashing:
        train_loop_config = {"task": {"kind": "reder"}, "time_cap_at": math.inf,
                             "progress": str(tmp_path / "progress.json"),
                             "train": dataclasses.asdict(TrainConfig())}

        def fit(self) -> None:
            ray.get(controller.make.remote(1.0), timeout=60)
            assert ray.available_resources().get("CPU", 0) <= full - 1
            ray.kill(controller)
            deadline = time.monotonic() + 30
            while state.actor_table(controller._actor_id.hex())["State"] != "DEAD" and time.monotonic() < deadline:
                time.sleep(0.1)
            raise ray.exceptions.ActorDiedError()

    with pytest.raises(StageError, match=r"^train: Ray Train failed: ActorDiedError: "):
        raytrain.fit_and_average(Crashing(), tmp_path, 1, None)
    wait_for_cpus(full, 10.0)


def test_a_fits_timeline_splits_its_seconds_by_the_workers_clock_and_is_empty_without_one():
    fitted = {"fit_started_at": 1000.0, "fit_ended_at": 1100.0}
    last = {"worker_started_at": 1012.5, "first_update_at": 1020.0, "last_update_at": 1091.25, "validation_seconds": 9.0}
    assert raytrain.timeline(fitted, last) == {"group_start_s": 12.5, "setup_s": 7.5, "updates_s": 71.2,
                                               "validation_s": 9.0, "end_s": 8.8}
    assert raytrain.timeline(fitted, {"step": 20, "stopped_by": "max_steps"}) == {}  # a report without the clock
    assert raytrain.timeline({}, last) == {}  # a fit without the driver's clock


def test_run_storage_removes_the_previous_run_only_with_force(tmp_path):
    previous = tmp_path / "train-abc" / "checkpoint_000001"
    previous.mkdir(parents=True)
    (previous / "model.pt").write_bytes(b"x")
    assert raytrain.run_storage(tmp_path, "train-abc", force=False) == tmp_path / "train-abc"
    assert previous.is_dir()  # an interrupted stage resumes from it
    assert raytrain.run_storage(tmp_path, "train-abc", force=True) == tmp_path / "train-abc"
    assert not (tmp_path / "train-abc").exists() and tmp_path.is_dir()
    raytrain.run_storage(tmp_path, "train-abc", force=True)  # nothing to remove: fine


def test_the_progress_bar_follows_rank_0s_progress_file_and_off_a_terminal_writes_lines(tmp_path, monkeypatch):
    """Rank 0 writes its step, loss and latest validation BLEU (kept between validations) to the run's
    progress file; the driver's bar reads it while the fit runs — on a terminal. Off a terminal (a log
    file), lines instead: step/total, loss terms, tokens/s, validation BLEU per direction, elapsed, ETA."""
    import io
    import time

    from pipeline import progress
    from pipeline.training.raytrain import progress_bar
    from pipeline.training.trainloop import write_progress

    path, state = tmp_path / "run" / "progress.json", {}
    write_progress(path, state, {"step": 5, "train_total": 3.25, "train_ctc_src2tgt": 2.0, "tokens_per_s": 1234.4,
                                 "valid_bleu": float("nan"), "bleu_src2tgt": float("nan")})
    write_progress(path, state, {"step": 10, "train_total": 2.5, "valid_bleu": 7.0, "bleu_src2tgt": 6.0,
                                 "bleu_tgt2src": 8.0, "bleu_src2tgt_unpenalised": 1.0, "blank_penalty_src2tgt": 2.0})
    write_progress(path, state, {"step": 15, "train_total": 2.0, "train_ctc_src2tgt": 1.5, "grad_norm": 3.0})
    assert json.loads(path.read_text()) == state == {
        "step": 15, "loss": 2.0, "valid_bleu": 7.0, "tokens_per_s": 1234.4, "terms": {"ctc_src2tgt": 1.5},
        "valid_bleu_by_direction": {"src2tgt": 6.0, "tgt2src": 8.0}}

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    for terminal in (True, False):
        screen = Terminal() if terminal else io.StringIO()
        monkeypatch.setattr("sys.stderr", screen)
        with progress_bar(path, 30, "train"):
            time.sleep(0.7)  # one poll
        if terminal:
            assert "train:  50%" in screen.getvalue() and "15/30" in screen.getvalue()
            assert "loss=2, valid_bleu=7" in screen.getvalue()
        else:  # one line: the file did not change after the first poll
            [line] = screen.getvalue().splitlines()
            assert line.startswith("train: 15/30 steps (50%), ")
            assert "elapsed 0:0" in line and "ETA " in line
            assert line.endswith("; loss 2 (ctc_src2tgt 1.5), 1,234 tokens/s, valid BLEU src2tgt 6.00, tgt2src 8.00")


def test_a_group_that_lost_a_host_keeps_its_batch_and_one_that_cannot_be_placed_says_what_to_do(tmp_path):
    """min_workers makes the group elastic; fewer ranks make up the batch by accumulation; a
    fit stopped by Ray Train's placement timeout names the keys and the command to go on."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2.api.exceptions import ControllerError

    assert raytrain.worker_count(TrainConfig(num_workers=2)) == 2
    assert raytrain.worker_count(TrainConfig(num_workers=4, min_workers=1)) == (1, 4)
    assert raytrain.worker_count(TrainConfig(num_workers=2, min_workers=2)) == 2  # min = max: fixed
    four = TrainConfig(num_workers=4, min_workers=1, update_freq=2)
    assert [trainloop.accumulation(four, world).update_freq for world in (4, 3, 2, 1)] == [2, 4, 4, 8]
    with pytest.raises(ValueError, match=r"min_workers: must be in \[0, num_workers \(2\)\], got 3"):
        TrainConfig(num_workers=2, min_workers=3)

    train = dataclasses.asdict(TrainConfig(num_workers=2, max_failures=1, start_timeout_s=5))
    timeout = ControllerError(WorkerGroupStartupTimeoutError(num_workers=2))
    message = raytrain.placement_failure(timeout, train, "teacher.train", tmp_path)
    assert message == (f"teacher.train: Ray Train could not place its 2 worker(s) within teacher.train.start_timeout_s=5 "
                       f"s, 2 tries (a host lost for good?); its checkpoints are kept under {tmp_path}: run the same "
                       f"command again once the cluster has the resources, or add teacher.train.min_workers=1 to go "
                       f"on from the last checkpoint with the hosts that remain")
    elastic = dataclasses.asdict(TrainConfig(num_workers=2, min_workers=1, max_failures=0))
    assert raytrain.placement_failure(timeout, elastic, "train", tmp_path) == (
        f"train: Ray Train could not place its group (elastic, 1 to 2 workers: an autoscaler that may bring the host "
        f"back keeps Ray Train asking for all of them) within train.start_timeout_s=60 s, 1 try (a host lost for "
        f"good?); its checkpoints are kept under {tmp_path}: run the same command again once the cluster has the "
        f"resources")
    assert raytrain.placement_failure(ControllerError(RuntimeError("other")), train, "train", tmp_path) is None
    assert raytrain.placement_failure(RuntimeError("a worker's"), train, "train", tmp_path) is None


def test_the_session_ray_instance_s_gcs_passes_the_address_probe(ray_session):
    """cluster.probe.ray_gcs asks a Ray address before ray.init does (tests/faults/test_services.py: the addresses
    that fail): Ray's own GCS answers it."""
    from cluster import probe

    address = ray_session.get_runtime_context().gcs_address
    assert probe.ray_gcs(address) is None, address


def test_a_snapshot_cut_short_by_a_kill_is_restored_from_the_kept_copy_or_removed(tmp_path):
    """Ray Train rewrites its checkpoint_manager_snapshot.json in place: a kill in between leaves it empty and the
    run could never resume (its controller fails to start: CheckpointManagerInitializationError). The copy
    kept while the fit ran replaces it when the checkpoints it names are there; otherwise it goes, and the run
    starts over."""
    run = tmp_path / "train-run"
    run.mkdir()
    whole = {"ray_version": "2.60.0", "checkpoint_results": [{"checkpoint_dir_name": "checkpoint_a"},
                                                             {"checkpoint_dir_name": "checkpoint_b"}]}
    snapshot = run / raytrain.SNAPSHOT
    assert raytrain.mend_snapshot(run) is None  # no run yet
    snapshot.write_text('{"ray_version": "2.60.0", "checkpoint_res', encoding="utf-8")  # being rewritten
    raytrain.keep_snapshot(run)
    assert not (run / raytrain.KEPT_SNAPSHOT).exists()  # only a whole one is kept
    snapshot.write_text(json.dumps(whole), encoding="utf-8")
    raytrain.keep_snapshot(run)
    assert json.loads((run / raytrain.KEPT_SNAPSHOT).read_text(encoding="utf-8")) == whole
    assert raytrain.mend_snapshot(run) is None and json.loads(snapshot.read_text(encoding="utf-8")) == whole
    for name in ("checkpoint_a", "checkpoint_b"):
        (run / name).mkdir()
    snapshot.write_text("", encoding="utf-8")  # killed between Ray's truncate and its write
    said = raytrain.mend_snapshot(run)
    assert said.endswith("restored from the last whole copy (2 checkpoint(s))")
    assert json.loads(snapshot.read_text(encoding="utf-8")) == whole
    (run / "checkpoint_b").rmdir()  # the copy names a checkpoint Ray has since deleted: it cannot be used
    snapshot.write_text("", encoding="utf-8")
    assert raytrain.mend_snapshot(run).endswith("are all there: removed") and not snapshot.exists()


def _checkpoint(run: Path, name: str, step: int) -> Path:
    """A checkpoint directory as trainloop._save writes it (tiny tensors)."""
    directory = run / name
    directory.mkdir(parents=True)
    torch.save({"w": torch.full((64,), float(step))}, directory / "model.pt")
    torch.save({"step": step}, directory / "train_state.pt")
    (directory / "history.json").write_text(json.dumps([{"step": step, "valid_bleu": 1.0}]), encoding="utf-8")
    return directory


def test_a_run_without_a_usable_record_resumes_from_the_newest_whole_checkpoint_on_disk(tmp_path, caplog):
    """No record (cut short with no usable copy, or never written: a kill after Ray copied a checkpoint but before
    it recorded it): the run resumes from the newest checkpoint directory whose files are all whole; one with a
    truncated .pt, a member whose bytes changed (CRC), a file missing or a history cut short is passed over; with
    none whole, or with a whole record, nothing is resumed by hand."""
    run = tmp_path / "train-run"
    assert raytrain.resume_point(run, "train") is None  # no run yet
    older = _checkpoint(run, "checkpoint_2026-11-29_12-58-24.603675", 5)
    newest = _checkpoint(run, "checkpoint_2026-11-29_12-58-26.306867", 15)
    middle = _checkpoint(run, "checkpoint_2026-11-29_12-58-25.596904", 10)
    assert raytrain.newest_whole_checkpoint(run) == (newest, 15)
    model = (newest / "model.pt").read_bytes()
    (newest / "model.pt").write_bytes(model[: len(model) // 2])  # Ray was copying it
    assert raytrain.newest_whole_checkpoint(run) == (middle, 10)
    weights = bytearray((middle / "model.pt").read_bytes())
    weights[weights.index(struct.pack("<f", 10.0) * 64) + 100] ^= 0xFF  # inside the tensor's bytes: its CRC fails
    (middle / "model.pt").write_bytes(bytes(weights))
    assert raytrain.newest_whole_checkpoint(run) == (older, 5)
    (older / "history.json").write_text('[{"step": 5, "va', encoding="utf-8")
    assert raytrain.newest_whole_checkpoint(run) is None
    (older / "history.json").write_text(json.dumps([{"step": 5}]), encoding="utf-8")

    (run / raytrain.SNAPSHOT).write_text("", encoding="utf-8")  # cut short, and no kept copy
    with caplog.at_level("WARNING"):
        assert raytrain.resume_point(run, "train") == older
    assert not (run / raytrain.SNAPSHOT).exists()
    said = caplog.messages[-1]
    assert said.startswith(f"train: Ray Train's record of its checkpoints under {run} was cut short") and said.endswith(
        f"removed; the run resumes from {older.name} (step 5), the newest whole checkpoint there"), said
    assert raytrain.resume_point(run, "teacher") == older  # never recorded
    assert caplog.messages[-1] == (f"teacher: checkpoints under {run} but no record of them (a kill before Ray Train "
                                   f"wrote it); the run resumes from {older.name} (step 5), the newest whole checkpoint there")
    (older / "train_state.pt").unlink()
    assert raytrain.resume_point(run, "train") is None  # nothing whole: the run starts over
    (run / raytrain.SNAPSHOT).write_text(json.dumps({"checkpoint_results": []}), encoding="utf-8")
    assert raytrain.resume_point(run, "train") is None  # a whole record: Ray resumes from what it names
