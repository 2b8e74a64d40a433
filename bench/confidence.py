"""Round-trip confidence measured as quality estimation is: how well each score ranks a model's translations by
their quality, both directions of a model directory, on a test set with references.

    python -m bench.confidence --model DIR [--data-dir ../shared/data/multi30k] [--test test_2016_flickr]
        [--limit N] [--flag 10] [--batch-size 64] [--out FILE]
    python -m bench.confidence --workdir W [--test test] ...     # a finished run: its model, its ingested split

Each source sentence is translated greedily with its scores (reder/confidence.py: `forward` log P(ŷ | x) per
output token, `round_trip` log P(x | ŷ) per source token, `score` their mean) and its quality is sacreBLEU's
sentence chrF against the reference. Beside them the baselines a QE practitioner would try first:
- `length_ratio`: −|log(|ŷ| / |x|) − its mean over the set| (characters; a translation of unusual length is
  suspect);
- `round_trip_chrf`: the surface round trip, ŷ translated back greedily and scored by chrF against x;
- `dual_xent`: dual conditional cross-entropy (Junczys-Dowmunt 2018) from the two directions, −(|H_f − H_b| +
  (H_f + H_b) / 2) with H_f = −forward and H_b = −round_trip.
For each score: Spearman's ρ and Kendall's τ-b with chrF (ties averaged), and the practical figure: flag the
lowest `--flag` % by the score, then the mean chrF of the flagged and of the kept, and the share of the truly
worst `--flag` % (by chrF) that the flag caught. A value the model cannot give (null with its reason) ranks lowest
(it is flagged first); ρ is also given over the sentences where every score has a value. `{test}.{lang}` files are read from --data-dir in the model directory's two languages.
Prints the report (JSON) and a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bench import MULTI30K, emit
from pipeline.metrics import kendall, spearman
from reder.confidence import lowest

SCORES = ("score", "forward", "round_trip", "dual_xent", "length_ratio", "round_trip_chrf")


def flagged(score: np.ndarray, quality: np.ndarray, percent: float) -> dict[str, float]:
    """Flag the lowest `percent` % by `score` (the first in input order among equals): the mean quality of the
    flagged and of the kept, and the share of the truly worst `percent` % by quality that was flagged."""
    flag = np.zeros(len(score), dtype=bool)
    flag[lowest(score.tolist(), percent)] = True
    worst = np.zeros(len(score), dtype=bool)
    worst[lowest(quality.tolist(), percent)] = True
    count = int(flag.sum())
    return {"flagged": int(count), "flagged_mean_chrf": round(float(quality[flag].mean()), 2),
            "kept_mean_chrf": round(float(quality[~flag].mean()), 2) if (~flag).any() else None,
            "worst_caught": round(float((flag & worst).sum() / count), 3)}


def _value(entry: dict[str, Any], key: str) -> float:
    value: Optional[float] = entry[key]
    return -math.inf if value is None else value


def measure(translator: Any, sources: list[str], references: list[str], src: str, tgt: str, percent: float,
            batch_size: int) -> dict[str, Any]:
    """One direction: every score against sentence chrF (the module doc)."""
    import sacrebleu

    scored = translator.translate(sources, src, tgt, scores=True, batch_size=batch_size)
    hypotheses = [entry["translation"] for entry in scored]
    back = translator.translate(hypotheses, tgt, src, batch_size=batch_size) if hypotheses else []
    quality = np.array([sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(hypotheses, references)])
    log_ratio = np.array([math.log(max(len(h), 1) / max(len(s), 1)) for h, s in zip(hypotheses, sources)])
    forward = np.array([_value(e, "forward") for e in scored])
    round_trip = np.array([_value(e, "round_trip") for e in scored])
    values = {
        "score": np.array([_value(e, "score") for e in scored]), "forward": forward, "round_trip": round_trip,
        "dual_xent": -(np.abs(forward - round_trip) + (-forward - round_trip) / 2),
        "length_ratio": -np.abs(log_ratio - log_ratio.mean()),
        "round_trip_chrf": np.array([sacrebleu.sentence_chrf(b, [s]).score for b, s in zip(back, sources)]),
    }
    defined = np.isfinite(forward) & np.isfinite(round_trip)
    values["dual_xent"] = np.where(defined, values["dual_xent"], -math.inf)
    return {"sentences": len(sources), "corpus_chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
            "mean_sentence_chrf": round(float(quality.mean()), 2),
            "no_value": {key: int((~np.isfinite(values[key])).sum()) for key in ("score", "forward", "round_trip")},
            "reasons": sorted({e["reason"] for e in scored if e["reason"]})[:5],
            "scores": {name: {"spearman": round(spearman(v, quality), 4), "kendall": round(kendall(v, quality), 4),
                              # where every score has a value: the ranking without the sentences ranked lowest for
                              # having none
                              "spearman_where_defined": round(spearman(v[defined], quality[defined]), 4),
                              **flagged(v, quality, percent)} for name, v in values.items()},
            "defined": int(defined.sum())}


def table(report: dict[str, Any]) -> str:
    """Markdown: per direction and score, ρ, τ, and the flagged figures."""
    percent = report["flag_percent"]
    lines = [f"| direction | score | Spearman ρ | Kendall τ | ρ where all are defined | chrF of the flagged "
             f"{percent:g} % / of the kept | worst {percent:g} % caught |", "|---|---|---|---|---|---|---|"]
    for direction, entry in report["directions"].items():
        for name, figures in entry["scores"].items():
            lines.append(f"| {direction} | {name} | {figures['spearman']:.3f} | {figures['kendall']:.3f} | "
                         f"{figures['spearman_where_defined']:.3f} ({entry['defined']}) | "
                         f"{figures['flagged_mean_chrf']:.1f} / {figures['kept_mean_chrf']:.1f} | "
                         f"{figures['worst_caught']:.0%} |")
    return "\n".join(lines)


def _read(path: Path) -> list[str]:
    """The lines of a test file (reder.text's rule), or exit naming the file and the line."""
    from reder.text import read_lines

    try:
        return read_lines(path.read_bytes())[0]
    except ValueError as error:
        raise SystemExit(f"{path}: {error}") from None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a REDER model directory (or --workdir)")
    parser.add_argument("--workdir", help="a finished pipeline run instead: its train stage's model and its ingested "
                                          "test split (--test names the split, default test)")
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--test", help="the set: files {test}.{lang} in --data-dir (default test_2016_flickr), or "
                                       "with --workdir an ingested split (default test)")
    parser.add_argument("--limit", type=int, default=0, help="the first N sentences (0: all)")
    parser.add_argument("--flag", type=float, default=10.0, help="flag the lowest this percent by each score")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", help="also write the report (JSON) here")
    args = parser.parse_args(argv)
    if not 0 < args.flag < 100:
        parser.error(f"--flag: a percentage between 0 and 100, got {args.flag}")
    if bool(args.model) == bool(args.workdir):
        parser.error("give --model DIR or --workdir W (a finished run), one of them")
    import reder

    if args.workdir:
        from pipeline.stages.evaluate import read_text_split

        run = json.loads((Path(args.workdir) / "last_run.json").read_text(encoding="utf-8"))
        stages = {name: Path(entry["output"]) for name, entry in run["stages"].items()}
        if not {"ingest", "train"} <= set(stages):
            raise SystemExit(f"{args.workdir}: no finished ingest and train stages in its last_run.json")
        args.model = str(stages["train"] / "model")
        args.test = args.test or "test"
        translator = reder.load(args.model)
        pair = read_text_split(stages["ingest"], args.test, args.limit)
        texts = dict(zip(translator.languages, pair))
    else:
        args.test = args.test or "test_2016_flickr"
        translator = reder.load(args.model)
        texts = {lang: _read(Path(args.data_dir) / f"{args.test}.{lang}")[: args.limit or None]
                 for lang in translator.languages}
    first, second = translator.languages
    report: dict[str, Any] = {"benchmark": "confidence", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "model": str(Path(args.model).resolve()), "test": args.test, "flag_percent": args.flag,
                              "directions": {}}
    for src, tgt in ((first, second), (second, first)):
        report["directions"][f"{src}->{tgt}"] = measure(translator, texts[src], texts[tgt], src, tgt, args.flag,
                                                        args.batch_size)
    emit(report, args.out)
    print(table(report), file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
