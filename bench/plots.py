"""The figures of docs/RESULTS.md, drawn from raw files already in docs/results/: nothing is measured here.

    python -m bench.plots [--results docs/results] [--out docs/results]

- `bleu_vs_latency_h100.png`: test 2016 BLEU against batch-1 latency (log scale) for every system and decoder of
  `quality_3000_h100.json` (bench.quality_table's rows of the one-H100 run, `configs/multi30k.yaml`'s models,
  3,000 updates) that has both numbers: the AR teachers' greedy and beam 4, REDER's CTC greedy with and without
  KD, the DAG's greedy, lookahead and Viterbi. The latency is en→de's (bench.quality times src2tgt); each system's
  two points are its BLEU en→de (filled) and de→en (hollow). Rows without a latency (the CTC beams, the
  reranker: not timed alone in that run) are left out, never estimated.
- `gpu_training_h200.png`: REDER's train stage in the one-run GPU recipe on one H200
  (`pipeline_multi30k_quick_h200/stop69-reder_history.json`, the history.json that stage published): the CTC
  loss per direction and the validation BLEU both ways, with the blank penalty chosen at each validation and
  without it, against the update.

A missing or unreadable input is an error naming the file.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
QUALITY = "quality_3000_h100.json"
HISTORY = "pipeline_multi30k_quick_h200/stop69-reder_history.json"
BLEU_VS_LATENCY, TRAINING = "bleu_vs_latency_h100.png", "gpu_training_h200.png"
TEST = "test_2016_flickr"
DIRECTIONS = {"src2tgt": "en→de", "tgt2src": "de→en"}


class PlotInputError(ValueError):
    """An input file that is missing, unreadable or lacks what a figure needs; the message names it."""


def read_json(path: Path) -> Any:
    """The file's JSON, or a PlotInputError naming the file."""
    if not path.is_file():
        raise PlotInputError(f"{path}: missing (bench.plots draws only from files already in docs/results/)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PlotInputError(f"{path}: not readable JSON ({error})") from error


def latency_points(report: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The rows of a bench.quality_table report with a batch-1 latency and test 2016 BLEU both ways."""
    points = []
    for row in report.get("rows", []):
        cells = [row.get(f"{TEST}.{direction}") for direction in DIRECTIONS]
        if row.get("latency_ms") and all(isinstance(cell, dict) and "bleu" in cell for cell in cells):
            points.append({"system": row["system"], "decoder": row["decoder"], "latency_ms": row["latency_ms"],
                           **{direction: cell["bleu"] for direction, cell in zip(DIRECTIONS, cells)}})
    if not points:
        raise PlotInputError(f"{path}: no row has both a batch-1 latency and {TEST} BLEU both ways")
    return points


def _label(system: str, decoder: str) -> str:
    """A point's label: the table's system (without the teachers' parenthesis) and decoder."""
    return f"{system.split(' (')[0]}: {decoder}"


def _label_positions(points: list[tuple[float, float]], height: float) -> list[tuple[float, float]]:
    """Where each point's label goes: points within 0.45 decades of latency form a group whose labels stand in one
    column right of the group's last point, `height` apart, in the points' order and centred on their mean."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and math.log10(points[i][0] / points[groups[-1][0]][0]) < 0.45:
            groups[-1].append(i)
        else:
            groups.append([i])
    places = [(0.0, 0.0)] * len(points)
    for group in groups:
        column = max(points[i][0] for i in group) * 1.25
        group.sort(key=lambda i: points[i][1])
        middle = sum(points[i][1] for i in group) / len(group)
        for rank, i in enumerate(group):
            places[i] = (column, middle + (rank - (len(group) - 1) / 2) * height)
    return places


def plot_bleu_vs_latency(report: dict[str, Any], path: Path, out: Path, device: str) -> Path:
    """Scatter of test 2016 BLEU (both directions) against batch-1 latency, one labelled colour per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    points = sorted(latency_points(report, path), key=lambda p: (p["latency_ms"], p["src2tgt"]))
    markers = {"AR": "s", "REDER-DAG": "^", "REDER": "o"}
    figure, axis = plt.subplots(figsize=(9, 5.5))
    colours = plt.get_cmap("tab10").colors
    places = _label_positions([(p["latency_ms"], p["src2tgt"]) for p in points], height=0.6)
    for index, (point, place) in enumerate(zip(points, places)):
        marker = next((m for prefix, m in markers.items() if point["system"].startswith(prefix)), "D")
        colour = colours[index % len(colours)]
        x = point["latency_ms"]
        axis.plot([x, x], [point["src2tgt"], point["tgt2src"]], color=colour, alpha=0.35, linewidth=1)
        axis.scatter([x], [point["src2tgt"]], marker=marker, color=colour, s=55, zorder=3)
        axis.scatter([x], [point["tgt2src"]], marker=marker, facecolors="none", edgecolors=colour, s=55, zorder=3)
        axis.annotate(_label(point["system"], point["decoder"]), (x, point["src2tgt"]),
                      xytext=(place[0], place[1] - 0.15), textcoords="data", fontsize=8, color=colour,
                      arrowprops={"arrowstyle": "-", "color": colour, "alpha": 0.5, "linewidth": 0.8})
    axis.set_xscale("log")
    axis.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.xaxis.set_minor_formatter(ticker.FuncFormatter(
        lambda value, _: f"{value:g}" if f"{value:g}"[0] in "25" else ""))
    axis.set_xlim(min(p["latency_ms"] for p in points) / 1.5, max(p["latency_ms"] for p in points) * 3.5)
    low = min([p["src2tgt"] for p in points] + [y for _, y in places])
    high = max([p["tgt2src"] for p in points] + [y for _, y in places])
    axis.set_ylim(low - 0.8, high + 0.8)
    axis.set_xlabel("latency at batch 1, ms a sentence (en→de; log scale)")
    axis.set_ylabel(f"BLEU, {TEST.replace('_', ' ')}")
    axis.set_title(f"BLEU against batch-1 latency, {device}\n(filled: en→de, hollow: de→en; from {path.name})",
                   fontsize=10)
    axis.grid(alpha=0.3, which="both")
    figure.tight_layout()
    target = out / BLEU_VS_LATENCY
    figure.savefig(target, dpi=110, metadata={"Software": None})
    plt.close(figure)
    return target


def plot_training(history: list[dict[str, Any]], path: Path, out: Path) -> Path:
    """Two panels against the update: the CTC loss per direction, and validation BLEU both ways."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    if not isinstance(history, list) or not history or not all(isinstance(h, dict) and "step" in h for h in history):
        raise PlotInputError(f"{path}: not a training history (a list of reports, each with a 'step')")
    validations = [h for h in history if "bleu_src2tgt" in h]
    losses = [key for key in ("train_ctc_src2tgt", "train_ctc_tgt2src", "train_dag_src2tgt", "train_dag_tgt2src")
              if any(key in h for h in history)]
    if not validations or not losses:
        raise PlotInputError(f"{path}: no validation BLEU or no output loss in the history")
    figure, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for key in losses:
        steps = [(h["step"], h[key]) for h in history if key in h]
        direction = DIRECTIONS[key.rsplit("_", 1)[1]]
        loss_axis.plot([s for s, _ in steps], [v for _, v in steps], label=f"{key.split('_')[1].upper()} {direction}")
    loss_axis.set_yscale("log")
    plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    loss_axis.yaxis.set_major_formatter(plain)
    loss_axis.yaxis.set_minor_formatter(plain)
    loss_axis.set(xlabel="update", ylabel="training loss (log scale)", title="output loss per direction")
    for direction, name in DIRECTIONS.items():
        line, = bleu_axis.plot([h["step"] for h in validations], [h[f"bleu_{direction}"] for h in validations],
                               marker="o", markersize=4, label=f"{name}, blank penalty chosen")
        unpenalised = [h for h in validations if f"bleu_{direction}_unpenalised" in h]
        if unpenalised:
            bleu_axis.plot([h["step"] for h in unpenalised], [h[f"bleu_{direction}_unpenalised"] for h in unpenalised],
                           linestyle="--", color=line.get_color(), alpha=0.6, label=f"{name}, no penalty")
    bleu_axis.set(xlabel="update", ylabel="validation BLEU (greedy)", title="validation BLEU both ways")
    for axis in (loss_axis, bleu_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    last = history[-1]
    stop = f", stopped by {last['stopped_by']} after {last['elapsed']:.0f} s" if "stopped_by" in last else ""
    device = f" on {last['device']}" if "device" in last else ""
    figure.suptitle(f"REDER's train stage{device}: {last['step']} updates{stop} (from {path.parent.name}/{path.name})",
                    fontsize=10)
    figure.tight_layout()
    target = out / TRAINING
    figure.savefig(target, dpi=110, metadata={"Software": None})
    plt.close(figure)
    return target


def draw(results: Path, out: Path) -> list[Path]:
    """Both figures from the files under `results`, written into `out`; every input is checked before drawing."""
    quality_path, history_path = results / QUALITY, results / HISTORY
    quality, history = read_json(quality_path), read_json(history_path)
    if not isinstance(quality, dict):
        raise PlotInputError(f"{quality_path}: not a bench.quality_table report (a JSON object with 'rows')")
    latency_points(quality, quality_path)
    out.mkdir(parents=True, exist_ok=True)
    device = quality.get("device", "device not recorded")
    return [plot_bleu_vs_latency(quality, quality_path, out, device), plot_training(history, history_path, out)]


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the raw files are (docs/results)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the PNGs go (docs/results)")
    args = parser.parse_args(argv)
    try:
        written = draw(args.results, args.out)
    except PlotInputError as error:
        parser.exit(2, f"error: {error}\n")
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
