"""Sizing the sweep that decides REDER's settings on one GPU: how many trials to pack on it, and how long each.

    python -m bench.sweep packing --data DIR --out P.json [--trials 1 2 4 8] [--seconds 20] [--config C] [key=value ...]
    python -m bench.sweep size --packing P.json --budget-s S [--trials 8] [--cores 16] [--out sizing.json]

`packing`: N REDER trainings at once on this machine's device (the GPU, else the CPU), one process each, for every
N of `--trials` — as N Tune trials packed with `train.gpus_per_worker` 1/N would share it, each a process of its own
with the machine's cores split between them (`--cores`, default all). Each builds the config's REDER and loss,
reads the training split `--data` (a stage's `train/` Parquet directory: distill's KD pairs or tokenize's
references) as a worker reads its shard, trains `--warmup` updates, waits for the others, then trains `--seconds`
through the pipeline's training core (pipeline/training/harness.py) at the config's `train.max_tokens`. Reports per N the
updates/s of each process and their sum, and the tokens/s (the training core's count over the window, summed).

`size`: from that measurement, the overrides that run `--trials` trials in a sweep of `--budget-s` seconds (the
`run_pipeline.py tune` command alone: Ray's start and the data stages' reuse included through `--fixed-s`): the
packing N with the most updates/s over all trials (the largest N within 5 % of it: more trials at once, fewer
waves), waves = ceil(trials / N), each trial's `train.max_time` what a wave leaves after a worker group's start
and end (`--start-s`) and its validations, `train.max_steps` the updates that time buys at N's rate (ASHA's max_t,
on steps), its rungs at a quarter and a half of it (`tune.grace_period`, reduction factor 2), validations at every
eighth. Prints the overrides, one per line, and writes them with the reasoning and what such a sweep cannot decide.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import REPO_ROOT

QUICK = REPO_ROOT / "configs" / "multi30k_quick.yaml"
NEAR_BEST = 0.95  # a packing within 5 % of the best total rate counts as the best: the larger N is taken


def _trainer(index: int, args: dict[str, Any], threads: int, barrier: Any, results: Any) -> None:
    """One packed training (a process of its own): `warmup` updates, the barrier, then `seconds` of training."""
    import torch

    from pipeline.config import load_config
    from pipeline.training.harness import Harness
    from pipeline.training.trainloop import read_shard
    from reder import REDER, DuplexLoss

    torch.set_num_threads(threads)
    cfg = load_config(args["config"], args["overrides"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(cfg.train.seed + index)
    model = REDER(cfg.model).to(device)
    examples, _ = read_shard(Path(args["data"]), 0, 1, model)
    # one report, at the timed window's end: its tokens/s are the whole window's (the training core's count)
    train = replace(cfg.train, seed=cfg.train.seed + index, max_steps=10**9, max_time=0.0, log_every=10**9,
                    validate_every=10**9, average_best=1, keep_checkpoints=max(cfg.train.keep_checkpoints, 1))
    harness = Harness(model, DuplexLoss(model, cfg.loss), train, device)
    harness.fit_examples(examples, until=args["warmup"])
    barrier.wait()
    harness.history.clear()
    timed = harness.fit_examples(examples, time_cap_s=args["seconds"])
    last = harness.history[-1] if harness.history else {}
    results.put({"process": index, "updates": timed["steps"], "seconds": timed["seconds"],
                 "updates_per_s": round(timed["steps"] / max(timed["seconds"], 1e-9), 3),
                 "tokens_per_s": round(last["tokens_per_s"], 1) if "tokens_per_s" in last else None,
                 "gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None})


def packing(args: argparse.Namespace) -> dict[str, Any]:
    """Per N of args.trials: N trainings at once, their rates and the sum."""
    import torch

    cores = args.cores or os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")
    shared = {"config": args.config, "overrides": args.overrides, "data": args.data, "warmup": args.warmup,
              "seconds": args.seconds}
    report: dict[str, Any] = {"benchmark": "sweep packing", "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                              else "cpu", "cores": cores, "config": args.config, "overrides": args.overrides,
                              "seconds": args.seconds, "warmup_updates": args.warmup, "packings": []}
    for count in args.trials:
        started = time.perf_counter()
        barrier, results = context.Barrier(count), context.Queue()
        threads = max(1, cores // count)
        processes = [context.Process(target=_trainer, args=(i, shared, threads, barrier, results)) for i in range(count)]
        for process in processes:
            process.start()
        runs = [results.get(timeout=args.seconds + 600) for _ in processes]
        for process in processes:
            process.join()
        failed = [p.exitcode for p in processes if p.exitcode]
        if failed:
            raise SystemExit(f"packing {count}: a training process failed (exit codes {failed})")
        runs.sort(key=lambda run: run["process"])
        entry = {"trials": count, "threads_per_trial": threads, "runs": runs,
                 "updates_per_s": round(sum(run["updates_per_s"] for run in runs), 3),
                 "tokens_per_s": round(sum(run["tokens_per_s"] or 0 for run in runs), 1),
                 "wall_s": round(time.perf_counter() - started, 1)}
        report["packings"].append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "runs"}), flush=True)
    return report


def size(report: dict[str, Any], trials: int, budget_s: float, fixed_s: float, start_s: float,
         cores: int) -> dict[str, Any]:
    """The sweep's overrides from a packing measurement (see the module's docstring)."""
    packings = [entry for entry in report["packings"] if entry["trials"] <= trials]  # never more at once than trials
    if not packings:
        raise SystemExit(f"no packing of at most {trials} trials was measured")
    best = max(entry["updates_per_s"] for entry in packings)
    chosen = max((entry for entry in packings if entry["updates_per_s"] >= NEAR_BEST * best),
                 key=lambda entry: entry["trials"])
    packed = chosen["trials"]
    waves = math.ceil(trials / packed)
    per_wave = (budget_s - fixed_s) / waves
    max_time = per_wave - start_s
    per_trial_rate = chosen["updates_per_s"] / packed
    # Validations: eight per trial, each about as long as ~1 % of the trial on a GPU (1,014 greedy sentences);
    # max_time counts training and validation alike, so the updates are what is left of it.
    max_time = math.floor(max_time * 0.92)
    if max_time < 10:
        raise SystemExit(f"{trials} trials in {budget_s:.0f} s leave {max_time} s of training each "
                         f"({waves} waves of {packed}): give the sweep more time or fewer trials")
    max_steps = max(8, int(max_time * per_trial_rate))
    validate_every = max(1, max_steps // 8)
    grace = max(validate_every, max_steps // 4)
    overrides = {"tune.num_samples": trials, "tune.max_concurrent": packed, "tune.scheduler": "asha",
                 "tune.grace_period": grace, "tune.reduction_factor": 2,
                 "train.gpus_per_worker": round(1 / packed, 4), "train.cpus_per_worker": max(1, cores // packed),
                 "train.max_time": max_time, "train.max_steps": max_steps, "train.validate_every": validate_every}
    return {"overrides": overrides, "packing": {k: v for k, v in chosen.items() if k != "runs"},
            "reasoning": {"best_total_updates_per_s": best, "near_best": NEAR_BEST, "waves": waves,
                          "budget_s": budget_s, "fixed_s": fixed_s, "start_s": start_s,
                          "seconds_per_wave": round(per_wave, 1), "updates_per_s_per_trial": round(per_trial_rate, 3)},
            "cannot_decide": [
                f"settings that only pay after more than ~{max_steps} updates ({max_time} s of a packed trial): the "
                "quick recipe trains one REDER alone on the GPU, faster per update than a packed trial",
                "ASHA stops trials at its rungs on validation BLEU at a quarter and half of the updates: a setting "
                "that starts slowly (glancing, a larger upsampling ratio) may be stopped before it would win",
                "differences smaller than the seed-to-seed spread (0.6 BLEU between two runs of one seed on the "
                "GPU): one trial per setting, so a winner within it is a tie, to be run again with seeds",
                "anything outside model.*, loss.*, train.* (distill.references, the teachers' beam): the sweep trains "
                "on one distilled corpus"]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pack = argparse.ArgumentParser(prog="python -m bench.sweep packing", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("--data", required=True, help="a training split: a stage's train/ Parquet directory")
    pack.add_argument("--out", required=True)
    pack.add_argument("--config", default=str(QUICK))
    pack.add_argument("--trials", type=int, nargs="+", default=[1, 2, 4, 8])
    pack.add_argument("--seconds", type=float, default=20.0)
    pack.add_argument("--warmup", type=int, default=10, help="updates before the timed window (CUDA's start)")
    pack.add_argument("--cores", type=int, default=0, help="cores split between the trainings (0: all)")
    pack.add_argument("overrides", nargs="*", metavar="key=value")
    sizing = argparse.ArgumentParser(prog="python -m bench.sweep size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sizing.add_argument("--packing", required=True)
    sizing.add_argument("--budget-s", type=float, required=True, help="seconds for the whole tune command")
    sizing.add_argument("--trials", type=int, default=8)
    sizing.add_argument("--fixed-s", type=float, default=45.0,
                        help="of the budget: Ray's start, the data stages' reuse, the sweep's end")
    sizing.add_argument("--start-s", type=float, default=30.0, help="a trial's worker group start and end")
    sizing.add_argument("--cores", type=int, default=0, help="the machine's cores (0: the measurement's)")
    sizing.add_argument("--out", help="write the sizing as JSON")
    commands = {"packing": pack, "size": sizing}
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], commands[argv[0]].parse_intermixed_args(argv[1:])
    if command == "packing":
        report = packing(args)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
        tmp.replace(out)
        return 0
    report = json.loads(Path(args.packing).read_text(encoding="utf-8"))
    result = size(report, args.trials, args.budget_s, args.fixed_s, args.start_s, args.cores or report["cores"])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")
    for key, value in result["overrides"].items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
