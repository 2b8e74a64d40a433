"""One table of every system in bench.quality's reports: quality both ways, round trip, decoding speed and
training cost side by side (what a user choosing between REDER and two AR models compares).

    python -m bench.quality_table T/teachers.json R/reder.json [R2/reder.json ...] [--baseline T2/teachers.json]
        [--out docs/results/quality_cpu]

Inputs are the `teachers` phase's report and one or more `reder` phase reports of the same machine (several
calls can split the variants: the numbers of one table come from one device; a mix is an error). Each row is
one system and decoder: sacreBLEU BLEU / chrF on test_2016_flickr and test_2017_flickr in both directions,
round-trip BLEU (x → ŷ → x̂ on test 2016; REDER with its greedy decoder, the teachers with the decoder of
the row), latency at batch 1 and sentences/s at batch 64 (en→de), REDER's speed-up over the teachers' beam 4
(measured in the same process when the reder phase had the teachers, else against the teachers phase's
timing on the same device), the updates and training seconds of the model, and the total seconds a system
costs from scratch: a KD-trained REDER adds both teachers' training and the distillation of the corpus.
`--baseline` adds the rows of other teachers reports (made with `bench.quality teachers --no-distill`, e.g.
teachers given as many seconds as REDER took), which are a baseline only, not the KD source.
Prints the Markdown; with `--out`, writes <out>.md and <out>.json (the rows).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.quality import LAST_UPDATE, TESTS, VARIANTS
from pipeline.stage import write_json, write_text

CELLS = [(split, direction) for split in TESTS for direction in ("src2tgt", "tgt2src")]
LABELS = {"kd": "REDER + KD, FBA + CC", "raw": "REDER, no KD, FBA + CC", "kd_noaux": "REDER + KD, no FBA/CC",
          "dag_kd": "REDER-DAG + KD, FBA + CC", "dag_kd_noaux": "REDER-DAG + KD, no FBA/CC",
          "raw_noaux": "REDER, no KD, no FBA/CC", "simplex": "simplex (one model per direction) + KD, no FBA/CC",
          "simplex_raw": "simplex (one model per direction), no KD, no FBA/CC"}  # VARIANTS' names
BASELINE = "teacher_beam4"


def _decoder_label(name: str) -> str:
    if name == LAST_UPDATE:
        return "greedy, last update (not averaged)"
    if name.startswith("teacher_"):
        return name.removeprefix("teacher_").replace("beam", "beam ")
    if name.startswith("beam"):
        size, _, rerank = name.removeprefix("beam").partition("_")
        return f"CTC beam {size}" + (" + teacher rerank" if rerank else "")
    return name


def load(path: Path, phase: str) -> dict[str, Any]:
    """A bench.quality report of `phase`, or a ValueError naming the file and what is wrong."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable JSON report ({error})") from error
    if not isinstance(report, dict):
        raise ValueError(f"{path}: not a JSON object")
    if report.get("benchmark") != "quality" or report.get("phase") != phase:
        raise ValueError(f"{path}: not a bench.quality '{phase}' report (benchmark={report.get('benchmark')!r}, "
                         f"phase={report.get('phase')!r})")
    return report


def _row(system: str, decoder: str, scores: dict, speed: dict, updates: str, train_s: float, total_s: float,
         speedup: float | None, roundtrip: tuple[float, float] | None) -> dict[str, Any]:
    return {"system": system, "decoder": _decoder_label(decoder),
            **{f"{split}.{direction}": scores[f"{split}.{direction}"] for split, direction in CELLS},
            "roundtrip_bleu_src": roundtrip[0] if roundtrip else None,
            "roundtrip_bleu_tgt": roundtrip[1] if roundtrip else None,
            "latency_ms": speed.get(f"{decoder}_latency_ms"),
            "sentences_per_s": speed.get(f"{decoder}_sentences_per_s"),
            "speedup_vs_teacher_beam4_batch1": speedup, "updates": updates, "train_s": round(train_s),
            "total_s": round(total_s)}


def _roundtrip(result: dict[str, Any]) -> tuple[float, float] | None:
    """The (en, de) round-trip BLEU a result carries, if any."""
    return (result["roundtrip_bleu_src"], result["roundtrip_bleu_tgt"]) if "roundtrip_bleu_src" in result else None


def _teacher_seconds(teachers: dict[str, Any]) -> float:
    return teachers["train_src2tgt"]["seconds"] + teachers["train_tgt2src"]["seconds"]


def _teacher_rows(teachers: dict[str, Any], system: str) -> list[dict[str, Any]]:
    """The rows of one teachers report: beam 4 and greedy, speed-ups against its own beam 4."""
    updates = f"{teachers['train_src2tgt']['steps']} + {teachers['train_tgt2src']['steps']}"
    speed, seconds, table = teachers["speed"], _teacher_seconds(teachers), []
    for decoder in (BASELINE, "teacher_greedy"):
        if decoder in teachers:
            speedup = speed[f"{BASELINE}_latency_ms"] / speed[f"{decoder}_latency_ms"]
            table.append(_row(system, decoder, teachers[decoder], speed, updates, seconds, seconds, round(speedup, 2),
                              _roundtrip(teachers[decoder])))
    return table


def rows(teachers: dict[str, Any], reders: list[dict[str, Any]],
         baselines: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Table rows: the KD teachers' decoders, other teachers trained as baselines only, then every REDER
    variant and seed with each of its decoders."""
    kd_cost = _teacher_seconds(teachers) + teachers["distill_seconds"]
    speed = teachers["speed"]
    table = _teacher_rows(teachers, "AR teachers (one per direction; the KD source)")
    for baseline in baselines:
        table += _teacher_rows(baseline, "AR teachers (one per direction; baseline only)")
    for report in reders:
        for key, entry in report.items():
            if not (isinstance(entry, dict) and "train" in entry):
                continue
            variant, _, seed = key.partition("_seed")
            kd = VARIANTS[variant][0]  # trained on the teachers' KD corpus
            label = LABELS[variant] + (f" (seed {seed})" if seed else "")
            own = entry.get("speed", {})  # none: trained with --no-speed and not timed by the speed phase
            decoders = [name for name, value in entry.items() if isinstance(value, dict) and f"{TESTS[0]}.src2tgt" in value]
            decoders.sort(key=lambda name: name == LAST_UPDATE)  # the published (averaged) model's decoders first
            for decoder in decoders:
                speedup = own.get(f"speedup_{decoder}_vs_{BASELINE}_batch1")
                if speedup is None and f"{decoder}_latency_ms" in own:
                    speedup = round(speed[f"{BASELINE}_latency_ms"] / own[f"{decoder}_latency_ms"], 2)
                roundtrip = _roundtrip(entry) if decoder == decoders[0] else None  # REDER's round trip is greedy
                train_s = entry["train"]["seconds"]
                table.append(_row(label, decoder, entry[decoder], own, str(entry["train"]["steps"]), train_s,
                                  train_s + (kd_cost if kd else 0.0), speedup, roundtrip))
    return table


def _cell(value: Any, form: str = "{:,.1f}") -> str:
    return "–" if value is None else form.format(value)


def _averaging(report: dict[str, Any]) -> str:
    """How a report's models were published (older reports: the last update)."""
    if not report.get("validate_every"):
        return ""
    return (f", each model the average of its best {report['average_best']} checkpoints by validation BLEU "
            f"(scored every {report['validate_every']} updates)")


def _timed(report: dict[str, Any]) -> bool:
    return any(isinstance(entry, dict) and "train" in entry and "speed" in entry for entry in report.values())


def _sources(teachers: dict[str, Any], reders: list[dict[str, Any]], baselines: list[dict[str, Any]]) -> str:
    """One line naming the device, dates and budgets of the reports."""
    line = (f"Device: {teachers['device']}. Teachers: {teachers['date']}, {teachers['steps']} updates per direction"
            f"{_averaging(teachers)}, distillation {teachers['distill_seconds']:,.0f} s.")
    for report in reders:
        variants = [key.partition("_seed")[0] for key, entry in report.items() if isinstance(entry, dict) and "train" in entry]
        aux = any(VARIANTS[variant][1] for variant in variants) and "aux_from_update" in report
        line += f" REDER: {report['date']}, {report['steps']} updates" + \
            (f" or {report['time_cap_s']:,.0f} s" if report.get("time_cap_s") else "") + \
            (f", FBA + CC from update {report['aux_from_update']}" if aux else "") + f"{_averaging(report)}" + \
            (f", timed alone by bench.quality speed ({report['speed_measured']['date']})"
             if "speed_measured" in report else "") + \
            (", timed without the teachers (speed-up against the teachers phase's timing)"
             if _timed(report) and not report.get("teachers_loaded") else "") + "."
    for report in baselines:
        line += f" Baseline teachers: {report['date']}, {report['steps']} updates per direction."
    return line


def markdown(table: list[dict[str, Any]], teachers: dict[str, Any], reders: list[dict[str, Any]],
             baselines: list[dict[str, Any]] = ()) -> str:
    """The Markdown table under the line naming its sources."""
    names = {"src2tgt": "en→de", "tgt2src": "de→en"}
    head = ["system", "decoder", *[f"{names[d]} {s[5:9]} BLEU / chrF" for s, d in CELLS], "round trip en / de",
            "latency b1 (ms)", "sent/s b64", "speed-up vs teacher beam 4 (b1)", "updates", "train s",
            "total s incl. KD"]
    lines = [_sources(teachers, reders, baselines), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        scores = [f"{row[f'{s}.{d}']['bleu']:.2f} / {row[f'{s}.{d}']['chrf']:.1f}" for s, d in CELLS]
        roundtrip = (_cell(row["roundtrip_bleu_src"]) + " / " + _cell(row["roundtrip_bleu_tgt"])
                     if row["roundtrip_bleu_src"] is not None else "–")
        cells = [row["system"], row["decoder"], *scores, roundtrip, _cell(row["latency_ms"]),
                 _cell(row["sentences_per_s"], "{:,.0f}"), _cell(row["speedup_vs_teacher_beam4_batch1"], "{:.2f}×"),
                 row["updates"], f"{row['train_s']:,}", f"{row['total_s']:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teachers", type=Path, help="the teachers phase's teachers.json")
    parser.add_argument("reder", type=Path, nargs="+", help="one or more reder phase reder.json files")
    parser.add_argument("--baseline", type=Path, action="append", default=[],
                        help="a teachers report made with --no-distill (e.g. teachers given REDER's training time); "
                             "repeatable")
    parser.add_argument("--out", default="", help="also write <out>.md and <out>.json")
    args = parser.parse_args(argv)
    try:
        teachers = load(args.teachers, "teachers")
        reders = [load(path, "reder") for path in args.reder]
        baselines = [load(path, "teachers") for path in args.baseline]
    except ValueError as error:
        parser.error(str(error))
    for path, report in [*zip(args.reder, reders), *zip(args.baseline, baselines)]:
        if report["device"] != teachers["device"]:
            parser.error(f"{path} was measured on {report['device']!r}, {args.teachers} on {teachers['device']!r}: "
                         "one table holds one device's numbers")
    table = rows(teachers, reders, baselines)
    text = markdown(table, teachers, reders, baselines)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out.with_suffix(".json"), {"teachers": str(args.teachers), "reder": [str(p) for p in args.reder],
                                              "device": teachers["device"], "rows": table})
        write_text(out.with_suffix(".md"), text)
    print(text)
    return text


if __name__ == "__main__":
    main()
