"""The pipeline CLI: run the stages in order, skipping finished ones, and summarise where outputs are.

    python run_pipeline.py [--config configs/X.yaml] [key=value ...]
                           [--stages ingest,spm,tokenize,teacher,distill,train,cmlm,evaluate] [--force] [--address auto]
                           [--dry-run]
    python run_pipeline.py tune [--config configs/X.yaml] [key=value ...] [--samples N] [--resume] [--force]
                                [--address auto]

The stages and what each needs are declared once in pipeline/graph.py; both commands walk that graph. The
teacher and distill stages run when something needs them: `distill.enabled` (sequence-level KD, the
paper's setting) needs both unless `distill.corpus` names an already-distilled corpus; the evaluation's
teacher baseline and reranking need the teachers. Otherwise they are reported as not needed. The cmlm stage
(pipeline/stages/cmlm.py) runs, and is listed, only when the evaluation asks for the CMLMs or --stages names it.
`tune` sweeps the training stage over the config's `tune.space` with Ray Tune (pipeline/stages/tune.py); see
`python run_pipeline.py tune --help`.
`--dry-run` prints, per stage, whether a run would run it or reuse its directory (or not need it), and why: the
deciding keys, or what differs from the nearest finished directory of the stage (pipeline/graph.py, `plan`).
Ray is connected once, here, before the first stage that runs on it.
On a cluster started with `ray up cluster.yaml`, the head's cluster file (cluster/head.py) supplies the Ray
address, the MLflow server and the shared workdir root (docs/cluster.md); options and overrides still win.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

OWN_PACKAGES = ("cluster", "pipeline", "reder", "bench", "run_pipeline")


def dependency_failure(error: ImportError) -> str | None:
    """The one line for a package the run needs that is missing or fails to import (not our own modules: that is a
    bug, its traceback stays), else None."""
    name = (error.name or "").split(".")[0]
    if not name or name in OWN_PACKAGES:
        return None
    how = "is not installed" if isinstance(error, ModuleNotFoundError) else "fails to import"
    return (f"the Python package {name!r} {how} in the environment of {sys.executable} ({error}); install the "
            f"requirements there: {sys.executable} -m pip install -r {Path(__file__).resolve().with_name('requirements.txt')}")


try:
    from cluster import ClusterError
    from cluster.connect import check_shared_storage, cluster_overrides, connect
    from pipeline import graph
    from pipeline.config import ConfigError, PipelineConfig, load_config, to_yaml
    from pipeline.signals import Terminated, forget, handle_sigterm, interruption
    from pipeline.stage import StageError, environment_errors, read_manifest, write_json, write_text
    from pipeline.stages import evaluate, tune
    from pipeline.tracking.runs import Tracker, stage_datasets
    from pipeline.tracking.store import TrackingLost, browse_hint, server_lost, tracking_uri
    from pipeline.training import raytrain
    from pipeline.training.runfiles import MODEL_DIR
except ImportError as missing:  # as a command: one line, exit 2 (imported, the error stays the importer's)
    line = dependency_failure(missing) if __name__ == "__main__" else None
    if line is None:
        raise
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)

REPO_ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
STAGES = graph.PIPELINE  # in run order


CONTINUE = "finished stages are kept and the interrupted one left nothing behind: run the same command again to continue"


def interrupted(error: BaseException, how_to_continue: str = CONTINUE) -> int:
    """The one line and exit code of an interrupted run (Ctrl-C: 130, SIGTERM: 143, as shells report them)."""
    terminated = isinstance(interruption(error), Terminated)
    disconnect_ray()
    print(f"error: interrupted by {'SIGTERM' if terminated else 'Ctrl-C'}; {how_to_continue}", file=sys.stderr)
    # What is left is the interpreter's exit, whose garbage collection of torch's, MLflow's and Ray's objects
    # took 3.6-9.7 s on a loaded 2-core box (py-spy: gc_collect_main, after the line above): a stop must be
    # prompt, and nothing of the run needs collecting (its runs are closed, its files written).
    gc.freeze()
    return 143 if terminated else 130


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="commands: (none) run the pipeline's stages; `tune` runs a Ray Tune "
                                            "sweep of the train stage (python run_pipeline.py tune --help)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML config (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. model.vocab_size=4000")
    parser.add_argument("--stages", default="", help=f"comma-separated stages (default: {','.join(s for s in STAGES if s not in graph.OPTIONAL)}, "
                        f"and {', '.join(graph.OPTIONAL)} when the evaluation needs it)")
    parser.add_argument("--force", action="store_true", help="redo the selected stages even when finished")
    parser.add_argument("--address", default="", help="Ray cluster address ('auto' for `ray up`/`ray start`)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print, per stage, whether it would run or reuse a directory and why; run nothing")
    return parser.parse_intermixed_args(argv)  # key=value may come before and after the options


def load_run_config(path: str, overrides: list[str]) -> PipelineConfig:
    """The config with the user's overrides, then the cluster file's settings for what they left unset."""
    cfg = load_config(path, overrides)
    extra = cluster_overrides(cfg.ray.address, cfg.tracking.enabled, cfg.tracking.uri, cfg.workdir)
    if extra:
        print(f"on a Ray cluster (cluster file): {' '.join(extra)}", flush=True)
        cfg = load_config(path, overrides + extra)
    return cfg


def select_stages(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STAGES]
    if unknown or not names:
        raise ConfigError(f"--stages: unknown stage(s) {unknown}; known stages, in order: {list(STAGES)}")
    return [name for name in STAGES if name in names]


_connected = False  # whether this invocation connected Ray (a test's own session is left alone)


def disconnect_ray() -> None:
    """Shut down the Ray this invocation connected (a local instance: its processes end), so that Ray's
    forwarded worker logs cannot come after the error line that ends a failed run."""
    global _connected
    if _connected:
        import ray

        ray.shutdown()
        _connected = False


def connect_ray(cfg: PipelineConfig) -> None:
    """Connect to Ray once (the config's cluster, or a local instance; a no-op when connected); on a cluster,
    check then that every node sees the workdir (stage outputs and checkpoints are read back by other nodes)."""
    import ray

    global _connected
    if ray.is_initialized():
        return
    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.object_store_memory_mb, cfg.ray.dashboard)
    _connected = True
    handle_sigterm()  # ray.init replaced ours with a sys.exit
    if cfg.ray.address:
        nodes = check_shared_storage(Path(cfg.workdir))
        logging.getLogger(__name__).info("cluster: %d nodes see the workdir %s", nodes, Path(cfg.workdir).resolve())


def run(cfg: PipelineConfig, stages: list[str], force: bool = False, started: float | None = None) -> dict[str, dict]:
    """Run `stages` in order; returns {stage: {output, status, counts, seconds}}. `started` (time.time() of the
    command's start, else now) starts the run's budget (`budget.max_time`), shared by its training stages."""
    deadline = (time.time() if started is None else started) + cfg.budget.max_time
    workdir = Path(cfg.workdir).resolve()
    with environment_errors(workdir, "the run could not create its workdir"):
        workdir.mkdir(parents=True, exist_ok=True)
    steps = {step.name: step for step in graph.plan(cfg, workdir, stages, force)}
    dirs = graph.output_dirs(cfg, workdir)
    if cfg.ray.address:  # on a cluster: connect and check the shared storage before anything runs
        connect_ray(cfg)
    to_run = [name for name, step in steps.items() if step.action == "run"]
    checked = bool(cfg.ray.address) and check_training_resources(cfg, to_run)  # a cluster: before anything runs
    summary: dict[str, dict] = {}
    tracker = Tracker(cfg.tracking, workdir, cfg.to_dict(), to_yaml(cfg), target=dirs[stages[-1]].name)
    name = "tracking"  # the stage under way, for an error's line
    try:
        for index, name in enumerate(stages, start=1):
            if steps[name].action == "not needed":
                print(f"[{index}/{len(stages)}] {name}: not needed ({steps[name].reason})", flush=True)
                continue
            expected = dirs[name]
            status = "ran" if steps[name].action == "run" else "skipped (finished earlier)"
            print(f"[{index}/{len(stages)}] {name}: {'running' if status == 'ran' else status} -> {expected}",
                  flush=True)
            started = time.time()
            inputs = None
            if status == "ran":
                inputs = graph.check_inputs(cfg, workdir, name)  # a missing or changed input fails before Ray and MLflow
                if graph.BY_NAME[name].uses_ray:
                    connect_ray(cfg)
                    checked = checked or check_training_resources(cfg, to_run)  # local: Ray starts here
                tracker.begin_stage(name, expected.name)
                tracker.log_datasets(stage_datasets(cfg, name, inputs))
            later = [n for n in stages[index:] if n in to_run]
            cap = graph.time_cap(cfg, name, later, deadline - time.time())
            if status == "ran" and cap != float("inf"):
                print(f"      {name}: {cap:.0f} s of the run's budget (budget.max_time={cfg.budget.max_time:g})", flush=True)
            output = graph.run(cfg, workdir, name, force=force, tracker=tracker, inputs=inputs, time_cap_s=cap)
            counts = read_manifest(output)["counts"]
            summary[name] = {"output": str(output), "status": status, "counts": counts,
                             "seconds": round(time.time() - started, 1)}
            if status == "ran":
                if name == "evaluate":
                    tracker.log_tables(output / evaluate.TRANSLATIONS_DIR)
                tracker.end_stage(output, counts, stage_artifacts(output),
                                  model=output / MODEL_DIR if name == "train" else None)
            if name == "evaluate":
                results = json.loads((output / evaluate.RESULTS_FILE).read_text(encoding="utf-8"))
                tracker.log_results(results)
                promoted = tracker.promote(results, dirs["train"])
                if promoted and status == "ran":
                    print(f"      registry: {promoted}", flush=True)
    except BaseException as error:
        lost = error if isinstance(error, TrackingLost) else server_lost(error, name)
        if lost is not None:  # nothing more is asked of that server: the next run closes its runs
            tracker.abandon()
            raise lost from error
        cause = interruption(error)
        reason = cause or error
        try:
            tracker.close(failed=True, error=f"{type(reason).__name__}: {reason}", killed=cause is not None)
        except Exception as close_error:  # the store on the same full disk: the run's own error is the one to report
            logging.getLogger(__name__).warning("MLflow: the runs could not be closed %s (%s)",
                                                "KILLED" if cause else "FAILED", close_error)
        raise
    tracker.close()
    with environment_errors(workdir, "the run could not write its record"):
        write_json(workdir / "last_run.json", {"config": cfg.to_dict(), "stages": summary,
                                               "mlflow_run_id": tracker.run_id})
        write_text(workdir / "config.yaml", to_yaml(cfg))
    return summary


def check_training_resources(cfg: PipelineConfig, to_run: list[str]) -> bool:
    """Whether the cluster can hold the worker group of every training stage that will run
    (raytrain.check_resources, each waiting its start_timeout_s for an autoscaler), so that a config the cluster
    cannot train fails at once, naming the stage's keys, rather than after the stages before it. Checked on a
    cluster before the first stage, on a local run before the first stage that starts Ray (tokenize: ingest
    and spm need no Ray, and a local Ray started for them alone would cost their starts its start-up).
    Returns True (checked)."""
    checks = [(graph.train_section(cfg, name), graph.train_keys(name)) for name in to_run if name in graph.TRAINING]
    if "tune" in to_run:
        checks.append((cfg.train, "train"))  # a trial trains with the train section
    if checks:
        connect_ray(cfg)
    for section, keys in checks:
        raytrain.check_resources(section, section.start_timeout_s, keys)
    return True


def sweep(cfg: PipelineConfig, force: bool = False, resume: bool = False) -> Path:
    """`tune`: the stages the sweep needs (finished ones skipped), then the sweep itself (`resume`: continue
    an interrupted one)."""
    tune.check_space(cfg)
    connect_ray(cfg)
    workdir = Path(cfg.workdir).resolve()
    for name in graph.needed(cfg, ("tune",)):
        output = graph.run(cfg, workdir, name, force=force and name == "tune", resume=resume and name == "tune")
    return output


def stage_artifacts(output: Path) -> list[Path]:
    """What a stage's MLflow run keeps as artifacts: its small files (reports, spm model, plots, hypotheses) and
    the teachers' per-direction model directories; never the Parquet data. (The train stage's model is logged
    as a model, `Tracker.end_stage`.)"""
    files = [p for p in sorted(output.iterdir()) if p.is_file() and p.name != "_SUCCESS"]
    return files + [p for p in (output / "src2tgt", output / "tgt2src") if p.is_dir()]


def print_summary(summary: dict[str, dict], workdir: Path, tracker_note: str) -> None:
    """Where each stage's output is, and each stage's own lines (`Stage.summary`: kept and dropped per split, ...)."""
    print("\nsummary")
    for name, entry in summary.items():
        print(f"  {name:<9} {entry['status']:<26} {entry['seconds']:>7.1f} s  {entry['output']}")
        for line in graph.BY_NAME[name].summary(Path(entry["output"]), entry["counts"]):
            print(f"      {line}")
    print(f"  workdir {workdir}   {tracker_note}")


def print_plan(cfg: PipelineConfig, stages: list[str], force: bool) -> None:
    """--dry-run: per stage, what a run would do (run, reuse, not needed), its directory, and why."""
    workdir = Path(cfg.workdir).resolve()
    for index, step in enumerate(graph.plan(cfg, workdir, stages, force), start=1):
        where = "" if step.action == "not needed" else f" -> {step.output}"
        print(f"[{index}/{len(stages)}] {step.name}: {step.action}{where}\n      why: {step.reason}", flush=True)


def guarded(work: Callable[[], tuple[Any, Any]], how_to_continue: str = CONTINUE
            ) -> tuple[int, tuple[Any, Any]]:
    """Run a command's `work` -> (0, its result); a user-facing error is one `error:` line and exit code 2,
    Ctrl-C or SIGTERM exit 130 or 143 (`interrupted`), each -> (code, (None, None)). User-facing: bad input or
    config, a stage that cannot run, the cluster, and the machine's failures (`stage.EnvironmentFailure`, a
    StageError: `work` wraps its stages in `stage.environment_errors`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    forget()
    handle_sigterm()
    try:
        return 0, work()
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM's Terminated
        return interrupted(error, how_to_continue), (None, None)
    except Exception as error:
        # A signal can land inside a library that turns it into an error of its own: Ray Train's fit, or an
        # extension module's import (pybind11's "ImportError: initialization failed", raised from the
        # KeyboardInterrupt, when Ctrl-C came while distill imported CTranslate2).
        if interruption(error):
            return interrupted(error, how_to_continue), (None, None)
        missing = dependency_failure(error) if isinstance(error, ImportError) else None  # one imported when needed
        if missing is None and not isinstance(error, (ConfigError, StageError, ClusterError)):
            raise
        disconnect_ray()
        print(f"error: {missing or error}", file=sys.stderr)
        return 2, (None, None)


def tune_main(argv: list[str]) -> int:
    """`run_pipeline.py tune ...`: the sweep (data stages first when not finished)."""
    parser = argparse.ArgumentParser(prog="run_pipeline.py tune", description=tune.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML config (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. tune.num_samples=4")
    parser.add_argument("--samples", type=int, default=0,
                        help="tune.num_samples (default: the config's): each grid point is run N times, so "
                             "--samples 3 with a 3-point grid makes 9 trials")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted sweep (Ctrl-C, SIGTERM, tune.time_budget_s) where it stopped")
    parser.add_argument("--force", action="store_true", help="start the sweep over, even when finished or interrupted")
    parser.add_argument("--address", default="", help="Ray cluster address ('auto' for `ray up`/`ray start`)")
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides) + ([f"ray.address={args.address}"] if args.address else []) \
        + ([f"tune.num_samples={args.samples}"] if args.samples else [])

    def work() -> tuple[PipelineConfig, Path]:
        cfg = load_run_config(args.config, overrides)
        workdir = Path(cfg.workdir).resolve()
        with environment_errors(workdir, "the sweep failed on it", store=tracking_uri(cfg.tracking, workdir)):
            return cfg, sweep(cfg, force=args.force, resume=args.resume)

    code, (cfg, out) = guarded(work, "finished stages are kept, the sweep published nothing and kept its state: "
                                     "the same command with --resume continues it")
    if code:
        return code
    counts = read_manifest(out)["counts"]
    print(f"\ntune: {counts['trials']} trials ({counts['summary']}); "
          f"best {cfg.tune.metric} {counts['best_' + cfg.tune.metric]:.2f} with {counts['best']}\n"
          f"  {out / 'trials.csv'}\n  {out / 'best.yaml'}  (train it: python run_pipeline.py --config "
          f"{out / 'best.yaml'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    started = time.time()  # the run's budget (budget.max_time) counts from here
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:
        return tune_main(argv[1:])
    args = parse_args(argv)
    overrides = list(args.overrides) + ([f"ray.address={args.address}"] if args.address else [])

    def work() -> tuple[PipelineConfig, dict[str, dict] | None]:
        cfg = load_run_config(args.config, overrides)
        stages = select_stages(args.stages) if args.stages else graph.pipeline_stages(cfg)
        workdir = Path(cfg.workdir).resolve()
        with environment_errors(workdir, "the run failed on it", store=tracking_uri(cfg.tracking, workdir)):
            if args.dry_run:
                print_plan(cfg, stages, args.force)
                return cfg, None
            return cfg, run(cfg, stages, force=args.force, started=started)

    code, (cfg, summary) = guarded(work)
    if code or summary is None:
        return code
    workdir = Path(cfg.workdir).resolve()
    note = "mlflow: off"
    if cfg.tracking.enabled:
        uri = tracking_uri(cfg.tracking, workdir)
        hint = browse_hint(uri, cfg.tracking.experiment)
        note = f"mlflow: {uri}" + (f"\n  browse: {hint}" if hint else "")
    print_summary(summary, workdir, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
