"""Tune stage: Ray Tune sweeps of training keys (the upsampling ratio, the auxiliary-loss weights and
their start step, or any other model/loss/train key), tracked in MLflow.

    python run_pipeline.py tune [--config configs/X.yaml] [key=value ...] [--samples N] [--resume] [--force]

The stages the sweep needs (pipeline/graph.py: the data stages and, with KD on, teacher and distill) run first,
skipped when a normal run finished them: trials never recompute them. Each
trial is a driver function (Ray 2.60's Train V2 pattern) that builds the train stage's Ray Train trainer (raytrain) for
its config, with `TuneReportCallback` forwarding rank 0's reports to Tune; ASHA (or FIFO) stops weak
trials on `tune.metric` (validation BLEU, the mean of both directions) over training steps. A trial that
fails is retried `tune.max_failures` times and then reported; the sweep goes on. `--samples N`
(tune.num_samples) draws the space N times: each grid point is run N times, each repeat with its own seed
(`trial_seed`: train.seed + the sample's number), so repeats show the spread of a point, not one result N times.

Finished only when every trial ended (finished, stopped early by the scheduler, failed after its retries):
Ctrl-C, SIGTERM or `tune.time_budget_s` stop the sweep through Tune's graceful stop, publish nothing and
keep Ray Tune's experiment state, which `--resume` continues (`Tuner.restore`). Trials stopped by Tune
have their Ray Train placement groups removed here (`raytrain.release_orphaned_groups`), so none waits for
CPUs a dead trial still holds.

MLflow: one parent run "tune" (the base config as params), one nested run per trial named by its values
(`lr=0.002 λfba=0.1`; its sampled values as
params, per-step training metrics, `valid_bleu`, `bleu_src2tgt`, `bleu_tgt2src` of its best validation);
trials stopped early are closed FINISHED with the tag `stopped_early`, failed ones FAILED with the error.

Output `<workdir>/tune-<hash>/`: `trials.csv` (one row per trial: id, status, sampled values, seed, steps, best
metric and both directions' BLEU), `bleu_vs_params.png` (validation BLEU against each searched key), and
`best.yaml` (the base config with the best trial's values: `run_pipeline.py --config best.yaml` trains it).
"""
from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import io
import logging
import math
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from pipeline.config import PipelineConfig, check_consistency, from_dict, to_yaml
from pipeline.stage import StageError, StageRun, write_text
from pipeline.stages import spm
from pipeline.tracking.sweeps import SweepTracker
from pipeline.training import raytrain

log = logging.getLogger(__name__)


def check_space(cfg: PipelineConfig) -> None:
    """A sweep needs a search space (checked before any stage runs)."""
    if not cfg.tune.space:
        raise StageError("tune: tune.space is empty; declare the keys to search in the config (see the "
                         "tune section of configs/default.yaml)")


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """The sweep: trials train on input `data`'s train split (distill's or tokenize's), validated on
    `tokenize`'s valid split against `ingest`'s text; results into `tmp`."""
    check_space(run.cfg)
    inputs = {"train_data": run.inputs["data"] / "train", **{name: run.inputs[name] for name in ("tokenize", "ingest", "spm")}}
    return _sweep(run.cfg, run.workdir, run.out.name, inputs, tmp, force=run.force, resume=run.resume)


def search_space(space: dict[str, dict]) -> dict[str, Any]:
    """The YAML space as Ray Tune search primitives (keys stay dotted)."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in space.items():
        if "choice" in spec:
            out[key] = tune.choice(spec["choice"])
        elif "grid" in spec:
            out[key] = tune.grid_search(spec["grid"])
        elif "uniform" in spec:
            out[key] = tune.uniform(*spec["uniform"])
        elif spec.get("zero"):
            low, high, zero = spec["loguniform"][0], spec["loguniform"][1], spec["zero"]
            out[key] = tune.sample_from(lambda _, low=low, high=high, zero=zero: _log_uniform_or_zero(low, high, zero))
        else:
            out[key] = tune.loguniform(*spec["loguniform"])
    return out


def _log_uniform_or_zero(low: float, high: float, zero: float) -> float:
    if random.random() < zero:
        return 0.0
    return math.exp(random.uniform(math.log(low), math.log(high)))


def trial_config(base: PipelineConfig, params: dict[str, Any]) -> PipelineConfig:
    """The base config with a trial's dotted values applied, validated like a loaded config. A trial is one
    point, not a sweep: its `tune.space` is empty (checked against the trial's own values, the base's space
    would refuse every upsampling ratio above the smallest)."""
    raw = copy.deepcopy(base.to_dict())
    raw["tune"]["space"] = {}
    for key, value in params.items():
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    cfg = from_dict(PipelineConfig, raw)
    check_consistency(cfg)
    return cfg


SEED = "train.seed"


def trial_seed(cfg: PipelineConfig, trial_id: str) -> int:
    """A trial's training seed: `train.seed` plus the number of the sample (of `tune.num_samples`) that drew it.
    Tune's default search numbers its trials in draw order (`<prefix>_00007`), each sample drawing every grid point
    once: trial k belongs to sample k // (grid points). So the repeats of a grid point train with seeds
    train.seed, +1, +2, ... (a spread, not one result N times), the points of one sample share a seed (compared on
    equal terms), and a point that random draws (`choice`, `uniform`) happen to repeat gets another seed too. A
    searcher's trial (optuna: an id without a number) gets a seed from its id; a swept `train.seed` is left alone."""
    if SEED in cfg.tune.space:
        return cfg.train.seed
    number = trial_id.rsplit("_", 1)[-1]
    if number.isdigit() and "_" in trial_id:
        points = math.prod(len(spec["grid"]) for spec in cfg.tune.space.values() if "grid" in spec)
        return cfg.train.seed + int(number) // points
    return cfg.train.seed + int(hashlib.sha256(trial_id.encode()).hexdigest(), 16) % 2**31


def trial_values(cfg: PipelineConfig, params: dict[str, Any], keys: list[str], trial_id: str) -> dict[str, Any]:
    """A trial's dotted values: the sampled keys, and its seed (`trial_seed`) where seeds vary across the sweep's
    trials (num_samples > 1): its MLflow run's params and name show it then."""
    values = {k: params[k] for k in keys}
    if cfg.tune.num_samples > 1 and SEED not in values:
        values[SEED] = trial_seed(cfg, trial_id)
    return values


def trial_run(trial_id: str) -> str:
    """The name of a trial's Ray Train run (its directory in the sweep's storage)."""
    return f"trial-{trial_id}"


def _trial(params: dict[str, Any], *, base: dict, keys: list[str], inputs: dict[str, str], storage: str,
           tracker: SweepTracker | None, progress_bars: bool = False) -> None:
    """One trial (runs in a Tune actor): the train stage's trainer (raytrain) for this config, reports forwarded.
    `progress_bars`: Ray Data's, as on the driver (a Tune actor's DataContext is not the driver's)."""
    import ray.data
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    ray.data.DataContext.get_current().enable_progress_bars = progress_bars
    trial_id = ray.tune.get_context().get_trial_id()
    values = trial_values(from_dict(PipelineConfig, base), params, keys, trial_id)
    cfg = trial_config(from_dict(PipelineConfig, base), values)
    target = tracker.trial_run(trial_id, values) if tracker is not None else None
    trainer = raytrain.make_trainer(cfg, trial_run(trial_id), Path(storage), Path(inputs["train_data"]),
                                 Path(inputs["tokenize"]), Path(inputs["ingest"]), Path(inputs["spm"]) / spm.MODEL_FILE,
                                 target, (TuneReportCallback(),))
    try:
        result = trainer.fit()
    except Exception as error:
        # Left RUNNING: the driver closes it, FAILED only if Tune reports the trial as errored (a trial
        # that Tune stops also lands here, its trainer interrupted).
        if tracker is not None:
            tracker.tag_error(target, error)
        raise
    if tracker is not None:
        tracker.finish_trial(target, _best_validation([m for _, m in result.best_checkpoints], cfg.tune.metric,
                                                      cfg.tune.mode))


def _best_validation(reports: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
    scored = [r for r in reports if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda r: r[metric])


TRIAL_ACTORS = ("ImplicitFunc", "TrainController")  # Tune's function trial and the Ray Train controller it starts


def _live_trial_actors(job_id: str) -> list[str]:
    """The class names of job `job_id`'s trial actors and Ray Train controllers not yet dead (from the GCS
    actor table, which needs no dashboard)."""
    import ray
    from ray._private.state import state

    table = state.actor_table(None, job_id=ray.JobID.from_hex(job_id))
    return [a["ActorClassName"] for a in table.values() if a["ActorClassName"] in TRIAL_ACTORS and a["State"] != "DEAD"]


def _release_all(job_id: str, timeout_s: float = 30.0, settle_s: float = 2.0) -> None:
    """After the fit: wait for the last trials' Ray Train runs to end (Tune kills their actors as it
    cleans up) and release what they leave, so the next Ray work in this process finds every CPU free.
    A group whose creator still lives after `timeout_s` is removed too: the fit has returned, so no trial of
    it runs, and such a controller (seen once in CI: a trial interrupted by the time budget while its Ray
    Train run was starting made its group after the fit returned) would hold its CPUs until the job ends.
    Done when nothing of the trials is left for `settle_s` in a row: a controller killed while it was creating
    its group has the group registered after the actor table says DEAD (bench/orphan_race.py), so one clean
    reading is not the end (seen in CI: a CPU held after a resumed sweep).
    After Ctrl-C or SIGTERM (`timeout_s` 0) nothing is waited for: the run is ending, and a wait for a trial's
    controller made its stop take 34 s where 10 are allowed (tests/faults)."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    deadline = time.monotonic() + timeout_s
    clean_since = None
    while time.monotonic() < deadline:
        # A trial's actors first: a controller still alive when the groups were counted could make its group
        # after (a CPU held after a resumed sweep, seen in CI: a Ray Train group of a dead creator, made after
        # the check had found none).
        live = _live_trial_actors(job_id)
        raytrain.release_orphaned_groups(job_id)
        if live or raytrain.job_groups(job_id) or raytrain.job_groups(job_id, by_actors=False):
            clean_since = None
        elif clean_since is None:
            clean_since = time.monotonic()
        elif time.monotonic() - clean_since >= settle_s:
            return
        time.sleep(0.5)
    # Tune's own trial groups (the driver's) are removed as Tune cleans up; one left after the fit (seen in CI: a
    # CPU still held 10 s after a resumed sweep, twice in CI) is removed here too.
    for by_actors, what in ((True, "Ray Train"), (False, "Tune trial")):
        left = raytrain.job_groups(job_id, by_actors)
        for group in left:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
        if left:
            log.warning("tune: removed %d %s placement group(s) still held %s", len(left), what,
                        f"{timeout_s:.0f} s after the sweep" if timeout_s else "when the sweep was interrupted")
    if timeout_s and (live := _live_trial_actors(job_id)):
        log.warning("tune: %s still alive %.0f s after the sweep", ", ".join(sorted(live)), timeout_s)


def _sweep_callback(budget_s: float = 0.0, every_s: float = 2.0) -> Any:
    """A Tune callback that runs `raytrain.release_orphaned_groups` for this job every `every_s` seconds of the
    sweep's loop (a stopped trial's actor is killed some time after Tune's verdict), keeps each trial's
    status as of the loop's last step (`ended`: what Tune itself decided, before an interruption or the
    budget stops the remaining trials, which end TERMINATED too, like the scheduler's), and once the fit
    has run `budget_s` seconds (0 = no limit) stops it the way Ctrl-C does (`timed_out`).

    Not Tune's own TuneConfig(time_budget_s): its stop marks the search finished and the running trials
    TERMINATED in the saved state, so a restored sweep would end at once with them "done"."""
    import ray
    from ray.tune import Callback

    class ReleaseStoppedTrials(Callback):
        def setup(self, **info: Any) -> None:  # each fit, a --resume's too (its job is another)
            self.job_id = ray.get_runtime_context().get_job_id()
            self.next_check = 0.0
            self.ended: dict[str, bool] = {}
            self.deadline = time.monotonic() + budget_s if budget_s else math.inf
            self.timed_out = False

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            self.ended = {trial.trial_id: trial.status in ("TERMINATED", "ERROR") for trial in trials}
            self.release()
            if not self.timed_out and time.monotonic() > self.deadline:
                log.warning("tune: tune.time_budget_s=%g ran out: stopping the sweep (its state is kept for "
                            "--resume)", budget_s)
                self.timed_out = True
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune's graceful stop, as on Ctrl-C

        def release(self) -> None:
            if time.monotonic() < self.next_check:
                return
            self.next_check = time.monotonic() + every_s
            count = raytrain.release_orphaned_groups(self.job_id)
            if count:
                log.info("tune: released %d placement group(s) of stopped trials' Ray Train runs", count)

    return ReleaseStoppedTrials()


def expected_trials(cfg: PipelineConfig) -> int:
    """How many trials the sweep makes: num_samples draws of the space, each grid point num_samples times."""
    return cfg.tune.num_samples * math.prod(len(spec["grid"]) for spec in cfg.tune.space.values() if "grid" in spec)


def _concurrency(cfg: PipelineConfig) -> int:
    """How many trials' worker groups the cluster holds at once (or tune.max_concurrent)."""
    import ray

    if cfg.tune.max_concurrent:
        return cfg.tune.max_concurrent
    have = ray.cluster_resources()
    fits = int(have.get("CPU", 0) // (cfg.train.num_workers * cfg.train.cpus_per_worker))
    if cfg.train.use_gpu:
        fits = min(fits, int(have.get("GPU", 0) // (cfg.train.num_workers * cfg.train.gpus_per_worker)))
    return max(1, fits)


def _sweep(cfg: PipelineConfig, workdir: Path, name: str, inputs: dict[str, Path], tmp: Path,
           force: bool = False, resume: bool = False) -> dict[str, Any]:
    import ray.data
    import ray.tune

    check_trial_fits(cfg)
    # The metric is reported at validations only; ASHA skips reports without it, Tune's strict check
    # would reject the first (training-only) report instead.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    keys = sorted(cfg.tune.space)
    storage = raytrain.storage_path(cfg.train, workdir) / name  # Tune's experiment directory
    restorable = ray.tune.Tuner.can_restore(str(storage))
    if force and storage.exists():
        log.info("--force: removing the previous sweep's state %s", storage)
        shutil.rmtree(storage)
        restorable = False
    if restorable and not resume:
        raise StageError(f"tune: an unfinished sweep's state is in {storage}: add --resume to continue it, or "
                         f"--force to start it over")
    if resume and not restorable:
        raise StageError(f"tune: --resume: no unfinished sweep to continue in {storage} (run without --resume)")
    tracker = SweepTracker.open(cfg.tracking, workdir, name, cfg.to_dict(), to_yaml(cfg), resume=resume)
    trainable = ray.tune.with_resources(
        ray.tune.with_parameters(_trial, base=cfg.to_dict(), keys=keys,
                                 inputs={k: str(v) for k, v in inputs.items()}, storage=str(storage),
                                 tracker=tracker, progress_bars=ray.data.DataContext.get_current().enable_progress_bars),
        # The driver function only waits on its trainer: no CPU (a CPU each would halve the concurrent
        # trials on a small machine), just the logical memory Ray needs for a non-empty request.
        DRIVER_RESOURCES)
    callback = _sweep_callback(cfg.tune.time_budget_s)
    if resume:
        log.info("tune: resuming the sweep in %s", storage)
        tuner = ray.tune.Tuner.restore(str(storage), trainable, resume_unfinished=True, resume_errored=False,
                                       restart_errored=False)
        tuner._local_tuner._run_config.callbacks = [callback]  # ours (this budget, this job), not the pickled copy
    else:
        tuner = _tuner(cfg, name, storage, trainable, callback)
    try:
        with _graceful_interrupts() as interrupted:
            grid = tuner.fit()
        # not after an abort: Ray is shut down then
        _release_all(ray.get_runtime_context().get_job_id(), timeout_s=0.0 if interrupted else 30.0)
        trials = grid._experiment_analysis.trials  # in the results' order; a trial never started has no result config
        ended = [callback.ended.get(trial.trial_id, False) for trial in trials]
        rows = [_row(result, keys, cfg, done, trial.config, trial.trial_id,
                     raytrain.recorded_history(storage / trial_run(trial.trial_id)))
                for result, done, trial in zip(grid, ended, trials)]
        if interrupted:  # Tune saved the experiment's state: --resume continues it; nothing is published
            if tracker is not None:
                tracker.close_trials(rows, killed=True)
            interrupted[0]()
        unfinished = expected_trials(cfg) - sum(ended)
        if unfinished:
            if tracker is not None:
                tracker.close_trials(rows, killed=True)
            budget = f"tune.time_budget_s={cfg.tune.time_budget_s:g} ran out" if callback.timed_out \
                else "Tune stopped"
            raise StageError(f"tune: {budget} with {unfinished} of {expected_trials(cfg)} trials unfinished "
                             f"({_counts(rows)}, {expected_trials(cfg) - len(rows)} not started); "
                             f"its state is kept in {storage}: add --resume to continue it")
        if tracker is not None:
            tracker.close_trials(rows)
        return _publish(cfg, rows, keys, tmp, tracker)
    except BaseException as error:
        if tracker is not None:  # whatever is still open is closed FAILED (KILLED when interrupted)
            tracker.close_trials([], failed=True, killed=not isinstance(error, Exception))
        raise


DRIVER_RESOURCES = {"cpu": 0, "memory": 256 * 1024**2}


def _tuner(cfg: PipelineConfig, name: str, storage: Path, trainable: Any, callback: Any) -> Any:
    import ray.tune

    tune = cfg.tune
    scheduler = ray.tune.schedulers.ASHAScheduler(
        time_attr="step", max_t=cfg.train.max_steps, grace_period=tune.grace_period or cfg.train.validate_every,
        reduction_factor=tune.reduction_factor) if tune.scheduler == "asha" else ray.tune.schedulers.FIFOScheduler()
    search_alg = None
    if tune.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch  # needs `pip install optuna`

        search_alg = OptunaSearch()
    return ray.tune.Tuner(
        trainable,
        param_space=search_space(tune.space),
        tune_config=ray.tune.TuneConfig(metric=tune.metric, mode=tune.mode, num_samples=tune.num_samples,
                                        scheduler=scheduler, search_alg=search_alg,
                                        max_concurrent_trials=_concurrency(cfg)),
        run_config=ray.tune.RunConfig(name=name, storage_path=str(storage.parent), callbacks=[callback],
                                      failure_config=ray.tune.FailureConfig(max_failures=tune.max_failures)))


@contextlib.contextmanager
def _graceful_interrupts() -> Iterator[list]:
    """Ctrl-C and SIGTERM during `Tuner.fit` stop the sweep the way Tune stops it on SIGUSR1 (its experiment
    state saved, the trials stopped); the list yielded then holds a function that raises what the signal's
    previous handler raises (KeyboardInterrupt; pipeline.signals' Terminated), to call once fit has returned.
    A second signal, or one before Tune's loop has started (SIGUSR1 still ours), raises at once."""
    interrupted: list = []
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}

    def before_tune(signum: int, frame: Any) -> None:  # SIGUSR1's default would end the process
        pass

    def handler(signum: int, frame: Any) -> None:
        if interrupted or signal.getsignal(signal.SIGUSR1) is before_tune:
            _raise_as(previous[signum], signum, frame)
        log.warning("tune: %s: stopping the sweep (its state is kept for --resume); again to abort at once",
                    signal.Signals(signum).name)
        interrupted.append(lambda: _raise_as(previous[signum], signum, None))
        os.kill(os.getpid(), signal.SIGUSR1)  # Tune's own graceful stop (tune.py _setup_signal_catching)

    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours instead, which also knows which signal it was
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGUSR1, before_tune)  # tune.run installs its own
    try:
        yield interrupted
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _raise_as(handler: Any, signum: int, frame: Any) -> None:
    if callable(handler):
        handler(signum, frame)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def check_trial_fits(cfg: PipelineConfig) -> None:
    """Fail fast, with the numbers, when one trial's resources can never be placed: its worker group
    (raytrain.check_resources: the cluster's totals, waiting train.start_timeout_s for an autoscaler), one
    worker's bundle on some node, and its driver function's memory."""
    import ray

    raytrain.check_resources(cfg.train, cfg.train.start_timeout_s)
    bundle = raytrain.worker_resources(cfg.train)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not any(all(node.get(k, 0.0) >= v for k, v in bundle.items()) for node in nodes):
        largest = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in bundle}
        raise StageError(f"tune: no node can hold one training worker ({bundle}; the largest node has "
                         f"{largest}); lower train.cpus_per_worker / train.gpus_per_worker")
    memory = ray.cluster_resources().get("memory", 0.0)
    if memory < DRIVER_RESOURCES["memory"]:
        raise StageError(f"tune: a trial's driver needs {DRIVER_RESOURCES['memory'] / 2**20:.0f} MiB of Ray "
                         f"memory, the cluster has {memory / 2**20:.0f} MiB")


def _counts(rows: list[dict[str, Any]]) -> str:
    """Trial counts by status, e.g. "6 finished, 2 stopped early, 1 failed"."""
    order = ("finished", "stopped early", "error", "unfinished", "not run")
    counts = {status: sum(r["status"] == status for r in rows) for status in order}
    return ", ".join(f"{n} {'failed' if status == 'error' else status}" for status, n in counts.items() if n) or "none"


def _row(result: Any, keys: list[str], cfg: PipelineConfig, ended: bool = True,
         params: dict[str, Any] | None = None, trial_id: str = "",
         recorded: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A trial's row of trials.csv from what Tune received of its reports and, `recorded`, its Ray Train run's
    own history (`raytrain.recorded_history`): a sweep stopped just as a trial finished loses the reports still on
    their way to Tune, while the trial's checkpoint holds them, so a trial that reached max_steps is "finished"."""
    frame = result.metrics_dataframe
    reports = (frame.to_dict("records") if frame is not None else []) + list(recorded or [])
    validated = [r for r in reports if isinstance(r.get("valid_bleu"), float) and math.isfinite(r["valid_bleu"])]
    best = _best_validation(validated, cfg.tune.metric, cfg.tune.mode) or {}  # the best validated report
    steps = max((int(r["step"]) for r in reports if isinstance(r.get("step"), (int, float))), default=0)
    # A trial that ended by its own rule (its max_steps, max_time or patience: a report's `stopped_by`) is
    # "finished"; only one that Tune ended before that is "stopped early" (by the scheduler); one that an
    # interruption or the time budget cut short is "unfinished", one that never reported "not run".
    own_end = steps >= cfg.train.max_steps or any(isinstance(r.get("stopped_by"), str) for r in reports)
    status = "error" if result.error else "not run" if not reports else "unfinished" if not ended else \
        "finished" if own_end else "stopped early"
    if not trial_id:
        trial_id = Path(result.path).name if result.path else ""
        trial_id = result.metrics.get("trial_id", trial_id) if result.metrics else trial_id
    row = {"trial_id": trial_id, "status": status, **{k: (params or result.config or {}).get(k) for k in keys},
           "seed": trial_seed(cfg, trial_id), "steps": steps,
           cfg.tune.metric: best.get(cfg.tune.metric, math.nan), "valid_bleu": best.get("valid_bleu", math.nan),
           "best_step": best.get("step", math.nan),
           "bleu_src2tgt": best.get("bleu_src2tgt", math.nan), "bleu_tgt2src": best.get("bleu_tgt2src", math.nan),
           "error": _last_line(result.error) if result.error else ""}
    return row


def _last_line(error: BaseException) -> str:
    """The innermost message of a (wrapped, multi-line) trial error: its last non-empty line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]


def _publish(cfg: PipelineConfig, rows: list[dict[str, Any]], keys: list[str], tmp: Path,
             tracker: SweepTracker | None) -> dict[str, Any]:
    metric = cfg.tune.metric
    scored = [r for r in rows if isinstance(r[metric], float) and math.isfinite(r[metric])]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["trial_id"])
    writer.writeheader()
    writer.writerows(rows)
    write_text(tmp / "trials.csv", buffer.getvalue())
    _print_table(rows)
    counts = {"trials": len(rows), "finished": sum(r["status"] == "finished" for r in rows),
              "failed": sum(r["status"] == "error" for r in rows),
              "stopped_early": sum(r["status"] == "stopped early" for r in rows), "summary": _counts(rows)}
    if not scored:
        raise StageError(f"tune: no trial reached a validation ({counts}); see {tmp / 'trials.csv'} for errors")
    best = (max if cfg.tune.mode == "max" else min)(scored, key=lambda r: r[metric])
    best_cfg = trial_config(cfg, {**{k: best[k] for k in keys}, SEED: best["seed"]})
    write_text(tmp / "best.yaml", f"# best of {len(rows)} trials by {metric} ({best[metric]:.2f}, trial "
                                  f"{best['trial_id']}): {', '.join(f'{k}={best[k]}' for k in keys)}\n"
                                  + to_yaml(best_cfg))
    _plot(rows, keys, metric, tmp / "bleu_vs_params.png")
    if tracker is not None:
        tracker.publish([tmp / name for name in ("trials.csv", "best.yaml", "bleu_vs_params.png")],
                        {f"best_{metric}": float(best[metric]), **counts})
    return {**counts, f"best_{metric}": best[metric], "best": {k: best[k] for k in keys}}


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = [c for c in rows[0] if c != "error"]
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row, source in zip(cells, rows):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)) + (f"  {source['error']}" if source["error"] else ""))


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _plot(rows: list[dict[str, Any]], keys: list[str], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4), squeeze=False)
    for axis, key in zip(axes[0], keys):
        for status, marker in (("finished", "o"), ("stopped early", "x")):
            points = [(r[key], r[metric]) for r in rows if r["status"] == status and math.isfinite(r[metric])]
            if points:
                axis.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=status)
        axis.set(xlabel=key, ylabel=f"{metric} (best validation)")
        if any(isinstance(r[key], float) for r in rows) and all(r[key] > 0 for r in rows if isinstance(r[key], float)):
            axis.set_xscale("log")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
