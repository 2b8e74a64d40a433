"""The pipeline CLI: run the stages in order, skipping finished ones, and summarise where outputs are.

    python run_pipeline.py [--config configs/X.yaml] [key=value ...]
                           [--stages ingest,spm,tokenize,teacher,distill,train,cmlm,evaluate] [--force] [--address auto]
    python run_pipeline.py tune [--config configs/X.yaml] [key=value ...] [--samples N] [--resume] [--force]
                                [--address auto]

The stages and what each needs are declared once in pipeline/graph.py; both commands walk that graph. The
teacher and distill stages run when something needs them: `distill.enabled` (sequence-level KD, the
paper's setting) needs both unless `distill.corpus` names an already-distilled corpus; the evaluation's
teacher baseline and reranking need the teachers. Otherwise they are reported as not needed. The cmlm stage
(pipeline/cmlm.py) runs, and is listed, only when the evaluation asks for the CMLMs or --stages names it.
`tune` sweeps the training stage over the config's `tune.space` with Ray Tune (pipeline/tune.py); see
`python run_pipeline.py tune --help`.
Ray is connected once, here, before the first stage that runs on it.
On a cluster started with `ray up cluster.yaml`, the head's cluster file (cluster/head.py) supplies the Ray
address, the MLflow server and the shared workdir root (docs/cluster.md); options and overrides still win.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cluster import ClusterError
from cluster.connect import check_shared_storage, cluster_overrides, connect
from pipeline import evaluate, graph, ingest, raytrain, train, tune
from pipeline.config import ConfigError, PipelineConfig, load_config, to_yaml
from pipeline.stage import StageError, is_done, read_manifest, write_json, write_text
from pipeline.tracking import Tracker, browse_hint, stage_datasets, tracking_uri

REPO_ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
STAGES = graph.PIPELINE  # in run order


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`, `ray job stop`, a scheduler's preemption): raised in the main thread like Ctrl-C's
    KeyboardInterrupt, so the running stage removes its temporary output and its MLflow runs end KILLED.
    A KeyboardInterrupt because `ray.get` answers only those at once: it re-raises them as a bare
    KeyboardInterrupt, and any other exception a signal handler raises inside it surfaces as a SystemError
    only when the awaited object is ready (minutes into a training run). Which signal it was is therefore
    kept here, by the handlers (`interruption`)."""


_received: list[KeyboardInterrupt] = []  # what this process's signal handlers raised, latest last


def _raise_terminated(signum: int, frame: object) -> None:
    _received.append(Terminated(f"SIGTERM (signal {signum})"))
    raise _received[-1]


def _raise_interrupted(signum: int, frame: object) -> None:
    _received.append(KeyboardInterrupt(f"Ctrl-C (signal {signum})"))
    raise _received[-1]


def handle_sigterm() -> None:
    """SIGTERM raises `Terminated`, SIGINT KeyboardInterrupt, each remembered (main thread only; `ray.init`
    installs its own SIGTERM handler, a sys.exit: call again after)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGINT, _raise_interrupted)


def interruption(error: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM behind `error`, if any: the latest our handlers raised when `error`, its cause
    or its context (a library that catches what the signal raised inside it and raises its own error, as
    Ray Train's fit does) is a KeyboardInterrupt, which `ray.get` may have made of our Terminated."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return _received[-1] if _received else error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


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
    connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.object_store_memory_mb)
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
    workdir.mkdir(parents=True, exist_ok=True)
    needed = graph.needed(cfg, ("evaluate", *[name for name in stages if name in graph.OPTIONAL]))  # named: wanted
    dirs = graph.output_dirs(cfg, workdir)
    if cfg.ray.address:  # on a cluster: connect and check the shared storage before anything runs
        connect_ray(cfg)
    to_run = [name for name in stages if name in needed and (force or not is_done(dirs[name]))]
    checked = bool(cfg.ray.address) and check_training_resources(cfg, to_run)  # a cluster: before anything runs
    summary: dict[str, dict] = {}
    tracker = Tracker(cfg.tracking, workdir, cfg.to_dict(), to_yaml(cfg), target=dirs[stages[-1]].name)
    try:
        for index, name in enumerate(stages, start=1):
            if name not in needed:
                print(f"[{index}/{len(stages)}] {name}: not needed (distill.enabled={cfg.distill.enabled}, "
                      f"distill.corpus={cfg.distill.corpus or 'unset'}, "
                      f"evaluate.teacher_baseline={cfg.evaluate.teacher_baseline}, "
                      f"evaluate.rerank={cfg.evaluate.rerank}, evaluate.cmlm_iterations="
                      f"{list(cfg.evaluate.cmlm_iterations)}, evaluate.refine_steps={list(cfg.evaluate.refine_steps)})",
                      flush=True)
                continue
            expected = dirs[name]
            status = "skipped (finished earlier)" if is_done(expected) and not force else "ran"
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
            later = [n for n in stages[index:] if n in needed and (force or not is_done(dirs[n]))]
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
                                  model=output / train.MODEL_DIR if name == "train" else None)
            if name == "evaluate":
                results = json.loads((output / evaluate.RESULTS_FILE).read_text(encoding="utf-8"))
                tracker.log_results(results)
                promoted = tracker.promote(results, dirs["train"])
                if promoted and status == "ran":
                    print(f"      registry: {promoted}", flush=True)
    except BaseException as error:
        cause = interruption(error)
        reason = cause or error
        tracker.close(failed=True, error=f"{type(reason).__name__}: {reason}", killed=cause is not None)
        raise
    tracker.close()
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
    """Where each stage's output is, and what was kept and dropped per split."""
    print("\nsummary")
    for name, entry in summary.items():
        print(f"  {name:<9} {entry['status']:<26} {entry['seconds']:>7.1f} s  {entry['output']}")
        for split in ingest.SPLITS:
            counts = entry["counts"].get(split)
            if not isinstance(counts, dict):
                continue
            if name == "tokenize":  # the CTC feasibility filter, by direction
                reasons = {k: counts[k] for k in ("infeasible_src2tgt", "infeasible_tgt2src") if counts[k]}
            else:
                reasons = {**counts["dropped"], **counts.get("flagged", {})}
            what = "dropped" if split == "train" else "flagged (kept)"
            print(f"      {split:<5} kept {counts['kept']:>8} of {counts['read']:>8}   {what}: {json.dumps(reasons)}")
        if name == "spm":
            print(f"      vocab_size {entry['counts']['vocab_size']} (blank id {entry['counts']['blank_id']})")
        if name == "teacher":
            for direction in ("src2tgt", "tgt2src"):
                counts = entry["counts"][direction]
                print(f"      {direction}: " + (f"{counts['steps']} steps, best validation BLEU {counts['best_valid_bleu']:.2f}"
                                                if "steps" in counts else "given checkpoint"))
        if name == "distill":
            counts = entry["counts"]
            print(f"      {counts['rows']} pairs; teacher BLEU vs reference {counts['teacher_bleu_src2tgt']:.2f} / "
                  f"{counts['teacher_bleu_tgt2src']:.2f}; length ratio {counts['length_ratio_src2tgt']:.2f} / "
                  f"{counts['length_ratio_tgt2src']:.2f}; reference fallbacks {counts['fallback_src2tgt']} / "
                  f"{counts['fallback_tgt2src']}")
        if name == "train":
            print(f"      {entry['counts']['steps']} steps, best validation BLEU {entry['counts']['best_valid_bleu']:.2f}, "
                  f"model: {Path(entry['output']) / train.MODEL_DIR}")
        if name == "evaluate":
            results = json.loads((Path(entry["output"]) / evaluate.RESULTS_FILE).read_text(encoding="utf-8"))
            print(f"      {results['split']} ({results['decoder']}):  BLEU src2tgt {results['bleu_src2tgt']:.2f}  "
                  f"tgt2src {results['bleu_tgt2src']:.2f}   chrF {results['chrf_src2tgt']:.1f} / "
                  f"{results['chrf_tgt2src']:.1f}   round trip {results['roundtrip_bleu_src']:.1f} / "
                  f"{results['roundtrip_bleu_tgt']:.1f}")
            for name, row in results.get("sets", {}).items():  # issue 56: every other scored set, a line each
                if name != results["split"]:
                    print(f"      {name} ({results['decoder']}):  BLEU src2tgt {row['bleu_src2tgt']:.2f}  tgt2src "
                          f"{row['bleu_tgt2src']:.2f}   chrF {row['chrf_src2tgt']:.1f} / {row['chrf_tgt2src']:.1f}")
    print(f"  workdir {workdir}   {tracker_note}")


def guarded(work: Callable[[], tuple[Any, Any]], how_to_continue: str = CONTINUE
            ) -> tuple[int, tuple[Any, Any]]:
    """Run a command's `work` -> (0, its result); a user-facing error is one `error:` line and exit code 2,
    Ctrl-C or SIGTERM exit 130 or 143 (`interrupted`), each -> (code, (None, None))."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _received.clear()
    handle_sigterm()
    try:
        return 0, work()
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM's Terminated
        return interrupted(error, how_to_continue), (None, None)
    except (ConfigError, StageError, ClusterError) as error:
        if interruption(error):
            return interrupted(error, how_to_continue), (None, None)
        disconnect_ray()
        print(f"error: {error}", file=sys.stderr)
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

    def work() -> tuple[PipelineConfig, dict[str, dict]]:
        cfg = load_run_config(args.config, overrides)
        return cfg, run(cfg, select_stages(args.stages) if args.stages else graph.pipeline_stages(cfg), force=args.force,
                        started=started)

    code, (cfg, summary) = guarded(work)
    if code:
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
