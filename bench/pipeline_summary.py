"""A finished pipeline run against the one-run GPU recipe's targets (configs/multi30k_quick.yaml): where the wall
time went (each stage, and the training loops' share of it: at most NON_TRAINING_SHARE outside them), the models'
BLEU both ways on every test set the run scored (test 2016 and test 2017 flickr: the teachers' beam 4, REDER
greedy within GREEDY_GAP of it, with sacreBLEU's paired bootstrap of the two where the hypothesis files are in the
workdir; a self-reranked CTC beam's gap beside where the run scored one: not a target, its batch-1 latency is far
over twice greedy's), REDER's steady training throughput, and what stopped each training stage.

    python -m bench.pipeline_summary --workdir W [--wall SECONDS] [--out FILE.json]

`--wall`: the command's own wall time (bench/gpu_env/quick_gpu.sh measures it), else the stages' sum. A run
stopped before its end (no last_run.json: its limit, Ctrl-C) is summed up from the manifests of the stages it
finished (`finished`: false), the scores of what it did not reach left empty. Steady
throughput: the median tokens/s of the reporting windows after the first fifth of the run (warm-up, first
shapes). Prints a Markdown table and one JSON object (also written to --out).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# The targets: REDER alone at its teachers' level (greedy within 1.0 BLEU of their beam 4, both ways, on each
# test set: a REDER decoder counts only with a batch-1 latency at most twice greedy's, which a CTC beam of 20
# reranked by the reverse direction is far over), the teachers themselves worth having on test 2016, the run's time
# and its share outside training.
TEACHER_BEAM4 = {"src2tgt": 35.0, "tgt2src": 38.0}  # on test 2016 ("test")
GREEDY_GAP = 1.0
STEADY_TOKENS_PER_S = 300_000
NON_TRAINING_SHARE = 0.25
PIPELINE_SECONDS = 540
BOOTSTRAP_SAMPLES = 1000


def steady_tokens_per_s(history: list[dict[str, Any]]) -> float | None:
    """Median tokens/s of the reporting windows after the first fifth of the steps."""
    windows = [h for h in history if isinstance(h.get("tokens_per_s"), (int, float))]
    if not windows:
        return None
    last = windows[-1]["step"]
    later = [h["tokens_per_s"] for h in windows if h["step"] > last / 5] or [windows[-1]["tokens_per_s"]]
    return statistics.median(later)


def training_seconds(workdir: Path, stage: str) -> float:
    """The training loops' seconds of a training stage: its Ray Train runs' `train_seconds`, once per run."""
    runs: dict[str, float] = {}
    for report in workdir.glob(f"{stage}-*/**/report.json"):
        entries = json.loads(report.read_text(encoding="utf-8"))
        for entry in entries.values() if "ray_run" not in entries else [entries]:
            if isinstance(entry, dict) and entry.get("train_seconds") is not None:
                runs[entry["ray_run"]] = float(entry["train_seconds"])
    return sum(runs.values())


def fit_timelines(workdir: Path, stages: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per training stage, where its seconds went (report.json's `timeline`, raytrain.timeline: the worker group's
    start, setup to the first update, the updates with their validations, the end) and `outside_fit_s`, the stage's
    seconds around its fit (checking inputs, averaging, the published model's validation, saving)."""
    found: dict[str, dict[str, float]] = {}
    for stage in ("teacher", "cmlm", "train"):
        for report in workdir.glob(f"{stage}-*/report.json"):
            entries = json.loads(report.read_text(encoding="utf-8"))
            entry = entries if "ray_run" in entries else next(
                (e for e in entries.values() if isinstance(e, dict) and "ray_run" in e), {})
            if entry.get("timeline") and stage in stages:
                found[stage] = {**entry["timeline"],
                                "outside_fit_s": round(stages[stage] - float(entry.get("fit_seconds") or 0), 1)}
    return found


def stage_seconds(workdir: Path) -> tuple[dict[str, float], bool]:
    """Each stage's seconds and whether the run finished: from last_run.json, which run_pipeline.py writes at the
    end of a run, else from the manifests of the stages that finished."""
    try:
        last_run = json.loads((workdir / "last_run.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        manifests = sorted((json.loads(m.read_text(encoding="utf-8")) for m in workdir.glob("*-*/manifest.json")),
                           key=lambda m: m["started"])  # in the order the stages ran
        return {m["stage"]: round(float(m["seconds"]), 1) for m in manifests}, False
    return {name: entry["seconds"] for name, entry in last_run["stages"].items()}, True


def _one_json(workdir: Path, pattern: str, default: Any) -> Any:
    """The JSON file matching `pattern` in `workdir` (one at most), `default` where the run did not write it."""
    found = sorted(workdir.glob(pattern))
    if len(found) > 1:
        raise SystemExit(f"error: {workdir}: {len(found)} files match {pattern}; one run per workdir")
    return json.loads(found[0].read_text(encoding="utf-8")) if found else default


def summary(workdir: Path, wall: float | None) -> dict[str, Any]:
    stages, finished = stage_seconds(workdir)
    wall = wall if wall is not None else sum(stages.values())
    training = {stage: training_seconds(workdir, stage) for stage in ("teacher", "cmlm", "train")}
    scores = _one_json(workdir, "evaluate-*/results.json", {"scores": {}})["scores"]
    history = _one_json(workdir, "train-*/history.json", [])
    stops = {}
    for stage in ("teacher", "train"):
        for manifest in workdir.glob(f"{stage}-*/manifest.json"):
            counts = json.loads(manifest.read_text(encoding="utf-8"))["counts"]
            for key, entry in ({"": counts} if "stopped_by" in counts else counts).items():
                if isinstance(entry, dict) and "stopped_by" in entry:
                    stops[f"{stage} {key}".strip()] = {k: entry.get(k) for k in ("stopped_by", "steps", "device",
                                                                                   "seed", "train_seconds")}
    test_sets = sorted({key.split(".")[0] for key in scores if not key.startswith("valid.")},
                       key=lambda name: (name != "test", name))
    bleu = {name: {direction: _gaps(scores, name, direction) for direction in ("src2tgt", "tgt2src")}
            for name in test_sets} or {"test": {d: _gaps(scores, "test", d) for d in ("src2tgt", "tgt2src")}}
    for name, row in _paired(workdir, bleu).items():
        bleu[name[0]][name[1]]["paired_bootstrap"] = row
    steady = steady_tokens_per_s(history)
    share = 1 - sum(training.values()) / wall if wall else None
    return {"workdir": str(workdir), "finished": finished, "wall_seconds": round(wall, 1), "stage_seconds": stages,
            "training_loop_seconds": training, "fit_timelines": fit_timelines(workdir, stages),
            "non_training_share": None if share is None else round(share, 3),
            "stops": stops, "test_bleu": bleu, "reder_steady_tokens_per_s": steady,
            "targets": {"pipeline_seconds": finished and wall <= PIPELINE_SECONDS,
                        "non_training_share": share is not None and share <= NON_TRAINING_SHARE,
                        "reder_tokens_per_s": steady is not None and steady >= STEADY_TOKENS_PER_S,
                        **{f"teacher_{d}": bleu["test"][d]["teacher_target_met"] for d in bleu.get("test", {})},
                        **{_target(name, d): bleu[name][d]["greedy_target_met"] for name in bleu for d in bleu[name]}}}


def _target(name: str, direction: str) -> str:
    """A target's name: `greedy_src2tgt` on test 2016 ("test"), `greedy_src2tgt_test_2017_flickr` on another set."""
    return f"greedy_{direction}" + ("" if name == "test" else f"_{name}")


def _gaps(scores: dict[str, Any], name: str, direction: str) -> dict[str, Any]:
    """Set `name`'s BLEU in `direction`: the teachers' beam 4, REDER greedy and (where scored) its self-reranked
    beam, their gaps."""
    def score(decoder: str) -> float | None:
        entry = scores.get(f"{name}.{direction}.{decoder}")
        return entry["bleu"] if entry else None
    reranked = next((key.split(".")[-1] for key in scores if key.startswith(f"{name}.{direction}.")
                     and key.endswith("_selfrerank")), None)
    teacher, greedy = score("teacher_beam4"), score("greedy")
    rerank = score(reranked) if reranked else None
    return {"teacher_beam4": teacher, "greedy": greedy, reranked or "selfrerank": rerank,
            "sentences": scores.get(f"{name}.{direction}.greedy", {}).get("sentences"),
            "teacher_target_met": teacher is not None and teacher >= TEACHER_BEAM4[direction],
            "greedy_gap": None if None in (teacher, greedy) else round(teacher - greedy, 2),
            "greedy_target_met": None not in (teacher, greedy) and teacher - greedy <= GREEDY_GAP,
            "reranked_gap": None if None in (teacher, rerank) else round(teacher - rerank, 2)}


def _paired(workdir: Path, bleu: dict[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """sacreBLEU's paired bootstrap (`duplex-compare`'s test) of REDER greedy against the teachers' beam 4 on each
    set and direction whose hypothesis files and translations table (the references) the evaluate stage left in
    the workdir: the difference, its p-value and the 95 % interval of greedy's BLEU under resampling."""
    from pipeline.compare import compare

    found = sorted(workdir.glob("evaluate-*/results.json"))
    if len(found) != 1:
        return {}
    evaluate_dir = found[0].parent
    runs: dict[str, dict[str, dict]] = {"teacher_beam4": {}, "greedy": {}}
    for name in bleu:
        table = evaluate_dir / "translations" / f"{name}.json"
        files = {(decoder, d): evaluate_dir / f"{name}.{d}.{decoder}.txt" for decoder in runs for d in ("src2tgt", "tgt2src")}
        if not table.is_file() or not all(path.is_file() for path in files.values()):
            continue
        columns = json.loads(table.read_text(encoding="utf-8"))
        references = {"src2tgt": columns["reference"], "tgt2src": columns["source"]}
        for decoder, entry in runs.items():
            entry[name] = {"references": references, "hypotheses": {
                d: files[decoder, d].read_text(encoding="utf-8").splitlines() for d in ("src2tgt", "tgt2src")}}
    rows, _, _ = compare(runs["teacher_beam4"], runs["greedy"], "bs", BOOTSTRAP_SAMPLES)
    return {(row["set"], row["direction"]): {"delta": round(float(row["delta"]), 2), "p_value": float(row["p_value"]),
                                             "greedy_ci95": round(float(row["b_ci"]), 2), "samples": BOOTSTRAP_SAMPLES}
            for row in rows if row["metric"] == "BLEU"}


def markdown(result: dict[str, Any]) -> str:
    rows = ["| set | | en→xx (src2tgt) | xx→en (tgt2src) |", "|---|---|---|---|"]
    for name, by_direction in result["test_bleu"].items():
        for key in ("teacher_beam4", "greedy", "greedy_gap", "reranked_gap", "sentences"):
            rows.append(f"| {name} | {key} | " + " | ".join(str(_round(by_direction[d].get(key))) for d in ("src2tgt", "tgt2src")) + " |")
        if all("paired_bootstrap" in by_direction[d] for d in ("src2tgt", "tgt2src")):
            rows.append(f"| {name} | greedy − teacher (p; greedy ±95 %) | " + " | ".join(
                "{delta:+.2f} (p {p_value:.3f}; ±{greedy_ci95:.2f})".format(**by_direction[d]["paired_bootstrap"])
                for d in ("src2tgt", "tgt2src")) + " |")
    stopped = [] if result["finished"] else ["the run stopped before its end (no last_run.json): the stages it "
                                             "finished, from their manifests", ""]
    lines = [*stopped, *rows, "", f"wall {result['wall_seconds']} s; stages " + ", ".join(
        f"{k} {v} s" for k, v in result["stage_seconds"].items()),
        f"training loops {result['training_loop_seconds']}; non-training share {result['non_training_share']}",
        "training stages' seconds: " + "; ".join(f"{k}: {v}" for k, v in result.get("fit_timelines", {}).items()),
        f"REDER steady tokens/s {_round(result['reder_steady_tokens_per_s'])}",
        "stops: " + "; ".join(f"{k}: {v}" for k, v in result["stops"].items()),
        "targets: " + ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in result["targets"].items())]
    return "\n".join(lines)


def _round(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--wall", type=float, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = summary(args.workdir.resolve(), args.wall)
    print(markdown(result))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
