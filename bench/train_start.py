"""A training stage's time to its first training step: stage start → rank 0's first update.

    python bench/train_start.py --config C [key=value ...] [--stage train|teacher|cmlm] [--runs 2] [--out FILE] [--timeline]

After `run_pipeline.py --config C [key=value ...] --stages ingest,spm,tokenize` has finished the data stages,
this runs the train stage (`graph.run(cfg, workdir, "train", force=True)`, on a local Ray instance started
first, as run_pipeline.py does) `--runs` times and reports for each: the seconds from the stage's start to the
first appearance of rank 0's progress file with step ≥ 1 (written after every update: `train.log_every=1` is
set here, a key that changes no output directory), polled every 50 ms; the stage's wall time; and the peak
RSS of the largest process under this one (a training worker, or Ray's object store process) and of all of
them together, sampled from /proc twice a second. `--stage teacher` (or cmlm; its inputs finished too) runs
that stage instead, with `<stage>.train.log_every=1`, and watches every Ray Train run of the stage (once a run per
direction, now one for both): `first_step_s` is the first run's first update,
`last_run_first_step_s` the last run's (when every model has been updated once). `--timeline` prints, per
run, when each Ray actor (the Ray Train controller, its helpers, the workers) was first seen in each state,
from the GCS actor table. Ray's start is not counted; checking the inputs (the stage's first act, as in a
pipeline run) is, and is also timed alone. Run as a file (not `-m`), so that
`PYTHONPATH=<another tree>` measures that tree's code with this same script.
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run as a file, its own directory comes first on sys.path, where bench/tokenize.py would shadow the standard
# library's tokenize (numpy imports it through inspect): drop that directory before anything imports it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Watch:
    """A thread that records when each progress file matching `pattern` under `storage` (one per Ray Train run)
    first shows step ≥ 1, and the peak RSS of this process tree."""

    def __init__(self, storage: Path, pattern: str) -> None:
        self.storage, self.pattern = storage, pattern
        self.first_steps: dict[Path, float] = {}
        self.peak_one_mb = self.peak_all_mb = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last_rss = 0.0
        while not self.stop.wait(0.05):
            for progress in self.storage.glob(self.pattern):
                if progress in self.first_steps:
                    continue
                try:
                    if int(json.loads(progress.read_text())["step"]) >= 1:
                        self.first_steps[progress] = time.time()
                except (OSError, ValueError, KeyError):
                    pass
            if time.time() - last_rss >= 0.5:
                last_rss = time.time()
                sizes = [_rss_mb(pid) for pid in _descendants(os.getpid())]
                self.peak_one_mb = max(self.peak_one_mb, max(sizes[1:], default=0.0))
                self.peak_all_mb = max(self.peak_all_mb, sum(sizes))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class Timeline:
    """With --timeline: a thread that reads Ray's actor table from the GCS every 50 ms and records when each actor
    of the run (by class) was first seen in each state, in seconds from `started` (where a stage's start goes)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.seen: dict[tuple[str, str], str] = {}
        self.events: list[tuple[float, str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        while not self.stop.wait(0.05):
            for raw in state._connect_and_get_accessor().get_actor_table(None, None):
                actor = gcs_pb2.ActorTableData.FromString(raw)
                key = (actor.actor_id.hex(), actor.class_name)
                status = gcs_pb2.ActorTableData.ActorState.Name(actor.state)
                if self.seen.get(key) != status:
                    if key in self.seen or status != "DEAD":  # not the actors of earlier runs
                        self.events.append((round(time.time() - self.started, 2), actor.class_name, status))
                    self.seen[key] = status

    def close(self) -> list[str]:
        self.stop.set()
        self.thread.join()
        return [f"{at:7.2f} s  {name} {status}" for at, name, status in self.events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--stage", choices=("train", "teacher", "cmlm"), default="train")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    parser.add_argument("--timeline", action="store_true",
                        help="also print, per run, when each Ray actor started and ended (from the GCS actor table)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()

    from pipeline import graph
    from pipeline.training import raytrain, runfiles
    from pipeline.config import load_config
    from run_pipeline import connect_ray, disconnect_ray

    section = "train" if args.stage == "train" else f"{args.stage}.train"
    cfg = load_config(args.config, [*args.overrides, f"{section}.log_every=1"])
    train = cfg.train if args.stage == "train" else getattr(cfg, args.stage).train
    workdir = Path(cfg.workdir).resolve()
    name = graph.output_dir(cfg, workdir, args.stage).name
    storage = raytrain.storage_path(train, workdir)
    pattern = f"{name}*/{runfiles.PROGRESS_FILE}"  # <name>/ (one run), or <name>-<direction>/ (a run each, as once)
    checking = time.time()
    graph.check_inputs(cfg, workdir, args.stage)  # the data stages must have run; graph.run checks them again
    check_inputs_s = round(time.time() - checking, 2)
    connect_ray(cfg)
    runs = []
    try:
        for _ in range(args.runs):
            for progress in storage.glob(pattern):
                progress.unlink()
            watch = Watch(storage, pattern)
            timeline = Timeline() if args.timeline else None
            started = time.time()
            try:
                graph.run(cfg, workdir, args.stage, force=True)
            finally:
                watch.close()
                lines = timeline.close() if timeline else []
            ended = time.time()
            if lines:
                print("\n".join(lines) + f"\n{max(watch.first_steps.values(), default=started) - timeline.started:7.2f} s  "
                      "first update (rank 0's progress file)", flush=True)
            firsts = sorted(watch.first_steps.values())
            runs.append({"first_step_s": round(firsts[0] - started, 2) if firsts else None,
                         **({"last_run_first_step_s": round(firsts[-1] - started, 2), "ray_train_runs": len(firsts)}
                            if args.stage != "train" and firsts else {}),
                         "stage_s": round(ended - started, 2), "peak_rss_largest_process_mb": round(watch.peak_one_mb),
                         "peak_rss_all_mb": round(watch.peak_all_mb)})
            print(json.dumps(runs[-1]), flush=True)
    finally:
        disconnect_ray()
    import pipeline

    result = {"code": str(Path(pipeline.__file__).resolve().parents[1]), "config": args.config, "stage": args.stage,
              "overrides": args.overrides, "num_workers": train.num_workers,
              "check_inputs_s (inside first_step_s)": check_inputs_s, "runs": runs,
              "load_average": os.getloadavg()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(Path(__file__).resolve().parents[1]))
    main()
