"""Which of the techniques that closed the NAT–AT gap elsewhere help REDER, each against the baseline at equal
updates, on CPU before any GPU time is spent (a filter, not a ranking for the GPU: a ~14-BLEU CPU model tells
which techniques do nothing or harm, not which wins at 35 BLEU).

    python -m bench.quality teachers --out Q --steps N ...            # the KD corpus (or a GPU run's, see below)
    python -m bench.ablation --from Q --out A [--techniques glance glance_blanks nmla nmla_ctc ratio3 ratio4 references]
        [--seeds 1 2 3] [--third-seed 0] [--steps 2000] [key=value ...]

Every model is REDER on the KD pairs of the teachers phase (bench/quality.py, its `_reder_inputs`), `--steps`
updates from the same initialisation and batches per seed (`train.seed`), the config's model and loss sections
with the key=value overrides (e.g. `model.d_model=256 model.layers_per_end=2`) as the baseline, and each technique
its own change of them (`TECHNIQUES`). Each is scored greedily on test 2016 and 2017 flickr both ways; its time per
update is measured beside; sacreBLEU's paired bootstrap (as `duplex-compare`) compares it with the baseline of its
seed on every test set and direction, and over the seeds the mean difference and its range. Where a technique's
seeds disagree on the sign of a difference, or one's 95 % interval holds zero, a third seed runs (`--third-seed`,
the baseline with it). Writes A/ablation.json and prints it; `--summary` prints the table of an existing one.

Each trained model's result and greedy outputs are kept in A/runs/<technique>-<seed>.json as soon as it is
scored, so a stopped ablation (a 2-core CPU trains one model in tens of minutes) goes on where it stopped when
run again with the same arguments; a kept run made with other arguments is an error that names its file.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from bench import MULTI30K, REPO_ROOT

class Technique(NamedTuple):
    """A technique's change of the baseline: model and loss overrides (a value "steps:F" is F × --steps, an
    int), and whether the references train beside the KD pairs (`distill.references`)."""

    model: dict[str, Any] = {}
    loss: dict[str, Any] = {}
    references: bool = False


TECHNIQUES: dict[str, Technique] = {
    "glance": Technique(loss={"glance_start": 0.5, "glance_end": 0.3, "glance_steps": "steps:1.0"}),
    "glance_blanks": Technique(loss={"glance_start": 0.5, "glance_end": 0.3, "glance_steps": "steps:1.0",
                                     "glance_blanks": True}),
    "nmla": Technique(loss={"nmla_start_step": "steps:0.8", "nmla_ngram": 2}),
    "nmla_ctc": Technique(loss={"nmla_start_step": "steps:0.8", "nmla_ngram": 2, "nmla_ctc_weight": 0.5}),
    "ratio3": Technique(model={"upsample_ratio": 3}),
    "ratio4": Technique(model={"upsample_ratio": 4}),
    "references": Technique(references=True),
}


def resolve(overrides: dict[str, Any], steps: int) -> dict[str, Any]:
    """The overrides with every "steps:F" replaced by int(F × steps)."""
    return {key: int(float(value.split(":", 1)[1]) * steps) if isinstance(value, str) and value.startswith("steps:")
            else value for key, value in overrides.items()}


def train_one(args: argparse.Namespace, cfg: Any, inputs: Any, examples: list, technique: str, seed: int,
              device: str, hypotheses: dict) -> dict[str, Any]:
    """One REDER of `technique` (or "baseline") at `seed`: its training (updates; wall and CPU seconds per update)
    and greedy scores; its greedy hypotheses go into `hypotheses[(technique, seed)]`. The wall time counts every
    pause of the process (a CI run beside it, SIGSTOP); the CPU time (this process's threads) does not, and is
    what the summary compares."""
    from bench.quality import _evaluate, _harness, _train_config
    from reder import DuplexLoss, REDER

    model_overrides, loss_overrides, references = TECHNIQUES.get(technique, Technique())
    model_cfg = replace(cfg.model, memory_efficient=False, **resolve(model_overrides, args.steps))
    loss_cfg = replace(cfg.loss, **resolve(loss_overrides, args.steps))
    torch.manual_seed(seed)
    model = REDER(model_cfg).to(device)
    harness = _harness(args, model, DuplexLoss(model, loss_cfg), replace(_train_config(args, cfg.train), seed=seed),
                       device)
    if references:  # as the train stage reads the KD rows with distill.references: each, then its references
        examples = [*examples, *((src, tgt, tgt, src) for src, tgt, _, _ in examples)]
    cpu_started = time.process_time()
    trained = harness.fit_examples(examples)
    cpu_seconds = time.process_time() - cpu_started
    kept: dict = {}
    entry = _evaluate(model, inputs, kept, speed=False)
    hypotheses[technique, seed] = kept["greedy"]
    return {"technique": technique, "seed": seed, "model_overrides": resolve(model_overrides, args.steps),
            "loss_overrides": resolve(loss_overrides, args.steps), "references": references,
            "train_pairs": len(examples), "train": trained,
            "seconds_per_update": round(trained["seconds"] / max(trained["steps"], 1), 4),
            "cpu_seconds_per_update": round(cpu_seconds / max(trained["steps"], 1), 4),
            "greedy": {cell: score["bleu"] for cell, score in entry["greedy"].items()}}


def unsettled(pairs: list[dict[str, dict[str, float]]]) -> bool:
    """Whether a technique's paired comparisons (one per seed) leave a cell open: signs that disagree, no
    difference at all (sacreBLEU's bootstrap gives equal outputs p ≈ 0.01), or a p-value that is not below 0.05."""
    return any(len({p[cell]["delta"] > 0 for p in pairs}) > 1
               or not all(p[cell]["delta"] != 0 and p[cell]["p_value"] < 0.05 for p in pairs) for cell in pairs[0])


def over_seeds(pairs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per cell: the mean difference over the seeds, its smallest and largest, and how many seeds found it
    significantly better or worse (p < 0.05)."""
    return {cell: {"mean_delta": round(sum(p[cell]["delta"] for p in pairs) / len(pairs), 2),
                   "min_delta": min(p[cell]["delta"] for p in pairs), "max_delta": max(p[cell]["delta"] for p in pairs),
                   "better": sum(p[cell]["delta"] > 0 and p[cell]["p_value"] < 0.05 for p in pairs),
                   "worse": sum(p[cell]["delta"] < 0 and p[cell]["p_value"] < 0.05 for p in pairs)}
            for cell in pairs[0]}


def setup_of(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two runs of one (technique, seed) the same training: everything but the techniques and seeds."""
    return {"from": str(Path(args.source).resolve()), "data_dir": str(Path(args.data_dir).resolve()),
            "config": str(Path(args.config).resolve()), "steps": args.steps, "max_tokens": args.max_tokens,
            "lr": args.lr, "warmup": args.warmup, "average_best": args.average_best, "train_limit": args.train_limit,
            "overrides": list(args.overrides)}


def kept_run(out: Path, technique: str, seed: int, setup: dict[str, Any]) -> dict[str, Any] | None:
    """The kept result of (technique, seed) in `out`/runs, if any; an error if it was made with another setup."""
    path = out / "runs" / f"{technique}-{seed}.json"
    if not path.exists():
        return None
    kept = json.loads(path.read_text(encoding="utf-8"))
    if kept["setup"] != setup:
        changed = sorted(key for key in {*setup, *kept["setup"]} if setup.get(key) != kept["setup"].get(key))
        raise SystemExit(f"{path}: made with other arguments ({', '.join(changed)} differ); "
                         f"use another --out or remove the file")
    return kept


def keep_run(out: Path, technique: str, seed: int, setup: dict[str, Any], entry: dict[str, Any],
             greedy: dict[str, list[str]]) -> None:
    """Write one trained model's result and greedy outputs to `out`/runs (a temporary file, then renamed)."""
    path = out / "runs" / f"{technique}-{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"setup": setup, "entry": entry, "greedy": greedy}), encoding="utf-8")
    tmp.replace(path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.quality import _header, _kd_examples, _paired_bootstrap, _reder_inputs
    from pipeline.config import load_config

    cfg = load_config(args.config, args.overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.phase, args.beam, args.validate_every, args.time_cap_s = "ablation", 1, 0, float("inf")
    inputs = _reder_inputs(args, cfg, device)
    examples = _kd_examples(inputs)
    report: dict[str, Any] = {**_header(args, device), "train_pairs": len(examples), "techniques": args.techniques,
                              "seeds": list(args.seeds), "runs": [], "paired": {}, "over_seeds": {}}
    hypotheses: dict = {}
    out, setup = Path(args.out), setup_of(args)

    def one(technique: str, seed: int) -> None:
        if (technique, seed) in hypotheses:
            return
        kept = kept_run(out, technique, seed, setup)
        if kept is not None:
            report["runs"].append(kept["entry"])
            hypotheses[technique, seed] = kept["greedy"]
            print(f"kept: {technique} seed {seed}", flush=True)
            return
        report["runs"].append(train_one(args, cfg, inputs, examples, technique, seed, device, hypotheses))
        keep_run(out, technique, seed, setup, report["runs"][-1], hypotheses[technique, seed])
        print(json.dumps(report["runs"][-1]), flush=True)

    seeds: dict[str, list[int]] = {technique: list(args.seeds) for technique in args.techniques}
    for seed in args.seeds:
        for technique in ("baseline", *args.techniques):
            one(technique, seed)
    for technique in args.techniques:
        pairs = [_paired_bootstrap(hypotheses["baseline", s], hypotheses[technique, s], inputs.data) for s in seeds[technique]]
        if args.third_seed and unsettled(pairs):
            one("baseline", args.third_seed)
            one(technique, args.third_seed)
            seeds[technique].append(args.third_seed)
            pairs.append(_paired_bootstrap(hypotheses["baseline", args.third_seed], hypotheses[technique, args.third_seed],
                                           inputs.data))
        report["paired"][technique] = dict(zip(map(str, seeds[technique]), pairs))
        report["over_seeds"][technique] = over_seeds(pairs)
    return report


def summary(report: dict[str, Any]) -> str:
    """A Markdown table: per technique its mean ΔBLEU (range over seeds; seeds better / worse) in each cell and
    its CPU seconds per update against the baseline's (the runs that measured it: older kept runs have wall time
    only, which pauses inflate)."""
    per_update: dict[str, list[float]] = {}
    for entry in report["runs"]:
        if "cpu_seconds_per_update" in entry:
            per_update.setdefault(entry["technique"], []).append(entry["cpu_seconds_per_update"])
    mean = {technique: sum(values) / len(values) for technique, values in per_update.items()}
    cells = list(next(iter(report["over_seeds"].values()))) if report["over_seeds"] else []
    lines = ["| technique | seeds | " + " | ".join(cells) + " | CPU s/update (× baseline) |",
             "|---|---|" + "---|" * len(cells) + "---|"]
    for technique, by_cell in report["over_seeds"].items():
        row = [f"{c['mean_delta']:+.2f} [{c['min_delta']:+.2f}, {c['max_delta']:+.2f}] {c['better']}↑{c['worse']}↓"
               for c in by_cell.values()]
        cost = (f"{mean[technique]:.3f} ({mean[technique] / mean['baseline']:.2f}×)"
                if technique in mean and "baseline" in mean else "—")
        lines.append(f"| {technique} | {len(report['paired'][technique])} | " + " | ".join(row) + f" | {cost} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--from", dest="source", help="the teachers phase's output directory (spm.model, kd.parquet)")
    parser.add_argument("--out", required=True, help="output directory (ablation.json)")
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "multi30k.yaml"))
    parser.add_argument("--techniques", nargs="+", default=["glance", "glance_blanks", "nmla", "ratio3"],
                        choices=list(TECHNIQUES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--third-seed", type=int, default=3, help="run where two seeds leave a cell open (0: never)")
    parser.add_argument("--steps", type=int, default=2000, help="updates per model")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=7e-4)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--average-best", type=int, default=1)
    parser.add_argument("--train-limit", type=int, default=0, help="the first N training pairs (0 = all)")
    parser.add_argument("--summary", action="store_true", help="print the table of OUT/ablation.json and stop")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=256")
    args = parser.parse_intermixed_args(argv)
    out = Path(args.out)
    if args.summary:
        print(summary(json.loads((out / "ablation.json").read_text(encoding="utf-8"))))
        return 0
    if not args.source:
        parser.error("--from: the teachers phase's output directory is needed")
    out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    tmp = out / ".ablation.json.tmp"
    tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
    tmp.replace(out / "ablation.json")
    print(summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
