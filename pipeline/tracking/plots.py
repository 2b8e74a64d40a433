"""The training curves a training run logs: loss terms and validation BLEU against the update, as a PNG."""
from __future__ import annotations

from pathlib import Path
from typing import Any

def history_panels(history: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The curves of `plot_history`, by panel: the output loss per direction (CTC, DAG or the teachers'
    NLL, with validation NLL), the auxiliary losses (FBA, CC; absent for teachers) and validation BLEU per
    direction. The weighted total is left out: it only sums the others."""
    keys = sorted({k for h in history for k in h})
    aux = [k for k in keys if k.startswith(("train_fba_", "train_cc_"))]
    output = [k for k in keys if (k.startswith("train_") and k not in aux and k != "train_total")
              or k.startswith("valid_nll_")]
    bleu = [k for k in ("bleu_src2tgt", "bleu_tgt2src") if k in keys]
    panels = {"output loss (log scale)": output, "auxiliary losses (log scale)": aux, "validation BLEU (greedy)": bleu}
    return {title: curves for title, curves in panels.items() if curves}


def plot_history(history: list[dict[str, Any]], path: Path) -> Path:
    """PNG, one panel per group of `history_panels`, side by side; legends beside the curves' ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = history_panels(history)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False, sharex=True)
    for axis, (title, curves) in zip(axes[0], panels.items()):
        logarithmic = "log scale" in title
        for key in curves:  # on a log scale, the zeros before the auxiliary losses switch on are left out
            points = [(h["step"], h[key]) for h in history if key in h and h[key] == h[key]
                      and (h[key] > 0 or not logarithmic)]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o" if "bleu" in key else None,
                      markersize=3, label=key.removeprefix("train_"))
        if logarithmic:
            axis.set_yscale("log")
        else:
            axis.ticklabel_format(axis="y", useOffset=False, style="plain")
        axis.set(xlabel="step", title=title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best", framealpha=0.6)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
