"""Stage two's collapse, dissected (issue 41): what FBA and cycle consistency (CC) do in the updates right after
they switch on, term by term.

    python -m bench.stage2_diag --workdir runs/stage2diag --out docs/results/stage2_diag_cpu.json \
        [--config configs/default.yaml] [key=value ...] [--first-stage 168] [--updates 14] [--variants none,fba,cc,both]

Needs the data stages of the config run first into the same workdir (no Ray needed afterwards):
`python run_pipeline.py --stages ingest,spm,tokenize workdir=runs/stage2diag` (the default's corpus, the SWORD
Bible, needs `apt-get install sword-text-web sword-text-sparv`).

What it does, in this process through the pipeline's training core (pipeline/harness.py, the train stage's
batches, seed and optimiser): trains the first stage (CTC only) to `--first-stage` updates (default: the config's
`loss.aux_start_step`), keeps that state, then continues `--updates` updates from it once per variant — `none`
(nothing added), `fba`, `cc`, `both` (the config's λs) and any of `VARIANTS` below — on the same batches.
Per update it logs: every loss term; the gradient of every weighted term separately (autograd.grad of
λ·term w.r.t. all parameters; their sum is the update's gradient), its norm, its norm after the update's
clipping, its share of the clipped total (the projection ⟨g_i, g⟩/|g|², the shares sum to 1) and the norm
of its gradient on the blank's embedding row (the blank's input embedding and, tied, its output vector).
On a fixed probe (the first `--probe` validation sentences) per direction: the blank's mean logit, the
share of output frames whose argmax is the blank, mean P(blank), and the greedy output length per sentence
(mean pieces) against the reference's. Validation greedy BLEU (the train stage's Validator, the same
`train.valid_max_sentences` sentences) per direction at the first stage's end and after every variant, and
with `--valid-every N` every N continuation updates. `--state FILE` saves the first stage (or loads it when the
file exists: other variants from the same state). Prints a table and writes JSON, and the table as Markdown
beside it (`--retable` rewrites both from the JSON's numbers).

Measured (docs/results/stage2_diag_cpu.*, stage2_diag_lr_cpu.*): 168 first-stage updates take ~12 min on one
thread; a continuation update ~4 s without the auxiliary terms and ~10-20 s with them (one backward per term).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import torch

from pipeline import spm
from pipeline.config import NO_BLANK_PENALTY, load_config
from pipeline.harness import Harness, epoch_batches, micro_batches, passes
from pipeline.trainloop import Validator
from reder import DIRECTIONS, EOS_ID, DuplexLoss, LossConfig, REDER
from reder.ctc import pad_batch
from reder.decode import ctc_greedy

# name → which auxiliary terms are on (at the config's λs), and what else differs from the config's recipe.
VARIANTS = {
    "none": {"fba": False, "cc": False},
    "fba": {"fba": True, "cc": False},
    "cc": {"fba": False, "cc": True},
    "both": {"fba": True, "cc": True},
    # CC with its gradient on the blank's embedding row zeroed: is the tied blank vector the path?
    "cc_noblankrow": {"fba": False, "cc": True, "zero_cc_blank_row": True},
    # The optimisation alone: nothing added, at a fraction of the schedule's learning rate / without clipping.
    "none_lr0.5": {"fba": False, "cc": False, "lr_scale": 0.5},
    "none_lr0.25": {"fba": False, "cc": False, "lr_scale": 0.25},
    "none_noclip": {"fba": False, "cc": False, "clip_norm": 0.0},
    "both_lr0.5": {"fba": True, "cc": True, "lr_scale": 0.5},
}


def _stage_dir(workdir: Path, stage: str) -> Path:
    found = sorted(workdir.glob(f"{stage}-*"))
    if not found:
        raise SystemExit(f"no {stage}-* under {workdir}: run the data stages first (see the module doc)")
    return found[-1]


def load_examples(path: Path) -> list[tuple[list[int], list[int]]]:
    table = pq.read_table(path)
    return list(zip(table.column("src_ids").to_pylist(), table.column("tgt_ids").to_pylist()))


class Probe:
    """Blank statistics and greedy lengths of a fixed set of validation sentences, per direction."""

    def __init__(self, valid_ids: Path, count: int) -> None:
        table = pq.read_table(valid_ids).sort_by("id").slice(0, count)
        self.inputs = {"src2tgt": [s + [EOS_ID] for s in table.column("src_ids").to_pylist()],
                       "tgt2src": [t + [EOS_ID] for t in table.column("tgt_ids").to_pylist()]}
        self.reference_lengths = {"src2tgt": [len(t) for t in table.column("tgt_ids").to_pylist()],
                                  "tgt2src": [len(s) for s in table.column("src_ids").to_pylist()]}

    @torch.no_grad()
    def __call__(self, model: REDER) -> dict[str, dict[str, float]]:
        was_training = model.training
        model.eval()
        blank = model.cfg.blank_id
        stats = {}
        for direction in DIRECTIONS:
            tokens, lengths = pad_batch(self.inputs[direction])
            logits = model.outputs(tokens, lengths, direction, normalise=False)
            out_lengths = logits.lengths
            logits = logits.log_probs  # the logits (normalise=False)
            mask = torch.arange(logits.shape[1])[None, :] < out_lengths[:, None]
            probs = logits.softmax(dim=-1)
            argmax = logits.argmax(dim=-1)
            frames = mask.sum()
            hyps = ctc_greedy(logits, out_lengths, blank)
            hyp_lengths = [len([t for t in h if t != EOS_ID]) for h in hyps]
            other = logits.clone()
            other[..., blank] = -math.inf
            stats[direction] = {
                "blank_logit": float(logits[..., blank][mask].mean()),
                "blank_margin": float((logits[..., blank] - other.max(dim=-1).values)[mask].mean()),
                "argmax_blank": float(((argmax == blank) & mask).sum() / frames),
                "p_blank": float(probs[..., blank][mask].mean()),
                "out_len": sum(hyp_lengths) / len(hyp_lengths),
                "ref_len": sum(self.reference_lengths[direction]) / len(hyp_lengths),
            }
        model.train(was_training)
        return stats


def term_gradients(model: REDER, terms: dict[str, torch.Tensor], loss_config: LossConfig,
                   zero_cc_blank_row: bool) -> tuple[dict[str, list], list, int]:
    """The gradient of every weighted term (autograd.grad, graph retained), named as the term; the parameters
    (in that order) and the index of the embedding among them."""
    params = [p for p in model.parameters() if p.requires_grad]
    name = model.head.name
    weighted = {}
    for d in DIRECTIONS:
        weighted[f"{name}_{d}"] = terms[f"{name}_{d}"]
        if f"fba_{d}" in terms:  # present only while on (duplex_loss, reder/objectives/duplex.py)
            weighted[f"fba_{d}"] = loss_config.lambda_fba * terms[f"fba_{d}"]
        if f"cc_{d}" in terms:
            weighted[f"cc_{d}"] = loss_config.lambda_cc * terms[f"cc_{d}"]
    grads = {}
    embed_index = next(i for i, p in enumerate(params) if p is model.embed.weight)
    for key, value in weighted.items():
        got = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        got = [torch.zeros_like(p) if g is None else g for g, p in zip(got, params)]
        if zero_cc_blank_row and key.startswith("cc_"):
            got[embed_index] = got[embed_index].clone()
            got[embed_index][model.cfg.blank_id] = 0.0
        grads[key] = got
    return grads, params, embed_index


def flat_dot(a: list, b: list) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


def offset_bleu(model: REDER, validator: Validator, offsets: list[float]) -> dict[str, dict[str, float]]:
    """Validation greedy BLEU per direction with the blank's logit lowered by each offset at decoding (the
    model's `project` wrapped on this instance only): how far a constant shift of the blank restores BLEU."""
    if not offsets:
        return {}
    project, blank, scores = model.project, model.cfg.blank_id, {}

    def shifted(offset: float):
        def wrapper(*args, **kwargs):
            output = project(*args, **kwargs)
            output.log_probs[..., blank] -= offset  # greedy is a per-frame argmax: log-probs or logits alike
            return output
        return wrapper

    try:
        for offset in offsets:
            model.project = shifted(offset)
            got = validator(model)
            scores[str(offset)] = {d: got[f"bleu_{d}"] for d in DIRECTIONS}
            print(f"  blank offset {offset}: valid BLEU {scores[str(offset)]}", flush=True)
    finally:
        del model.project  # the class's method again
    return scores


class Averages:
    """Exponential moving averages of a model's weights, one per decay d (ema ← d·ema + (1 − d)·w after every
    update, from the weights it starts from), and their validation: is the oscillation one of the weights?"""

    def __init__(self, model: REDER, decays: tuple[float, ...]) -> None:
        self.model = model
        self.shadows = {d: {k: v.detach().clone() for k, v in model.state_dict().items()} for d in decays}

    def update(self) -> None:
        with torch.no_grad():
            for decay, shadow in self.shadows.items():
                for key, value in self.model.state_dict().items():
                    if value.is_floating_point():
                        shadow[key].mul_(decay).add_(value.detach(), alpha=1 - decay)
                    else:
                        shadow[key].copy_(value)

    def validate(self, validator: Validator) -> dict[str, dict[str, float]]:
        scores = {}
        for decay, shadow in self.shadows.items():
            twin = REDER(self.model.cfg, self.model.loss_config)
            twin.load_state_dict(shadow)
            scores[str(decay)] = validator(twin)
        return scores


def continue_variant(state: dict, cfg, examples, name: str, spec: dict, updates: int, probe: Probe,
                     validator: Validator, first_stage: int, valid_every: int = 0,
                     blank_offsets: tuple[float, ...] = (), ema: tuple[float, ...] = ()) -> dict:
    base = cfg.loss
    loss_config = replace(base, lambda_fba=base.lambda_fba if spec["fba"] else 0.0,
                          lambda_cc=base.lambda_cc if spec["cc"] else 0.0, aux_start_step=first_stage,
                          fba_start_step=None, cc_start_step=None, **spec.get("loss", {}))
    model = REDER(cfg.model, loss_config)
    objective = DuplexLoss(model)
    harness = Harness(model, objective, cfg.train, "cpu")
    harness.load_state_dict(copy.deepcopy(state))
    lr_scale = spec.get("lr_scale", 1.0)  # the schedule's shape kept, its level scaled
    harness.scheduler.base_lrs = [lr * lr_scale for lr in harness.scheduler.base_lrs]
    for group in harness.optimizer.param_groups:
        group["lr"] *= lr_scale
    clip = spec.get("clip_norm", cfg.train.clip_norm)
    clip = clip if clip > 0 else math.inf
    model.train()
    epochs = lambda epoch: epoch_batches(examples, cfg.train.max_tokens, cfg.train.seed, epoch,  # noqa: E731
                                         count=cfg.train.batch_tokens)
    stream = micro_batches(epochs, *harness.position)
    averages = Averages(model, ema)
    rows = []
    for number in range(1, updates + 1):
        epoch, index, batch_examples = next(stream)
        harness.epoch, harness.next_batch = epoch, index + 1
        batch, reverse = passes(batch_examples, "cpu")
        model.train()
        harness.optimizer.zero_grad(set_to_none=True)
        started = time.perf_counter()
        terms = objective(*batch, harness.step, tgt2src_batch=reverse)
        grads, params, embed_index = term_gradients(model, terms, loss_config, spec.get("zero_cc_blank_row", False))
        total = [sum(g[i] for g in grads.values()) for i in range(len(params))]
        total_norm = math.sqrt(flat_dot(total, total))
        scale = min(1.0, clip / (total_norm + 1e-6))
        for p, g in zip(params, total):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(params, clip)
        lr = harness.scheduler.get_last_lr()[0]
        blank_row_before = model.embed.weight[model.cfg.blank_id].detach().clone()
        harness.optimizer.step()
        harness.scheduler.step()
        harness.step += 1
        averages.update()
        row = {"step": harness.step, "lr": lr, "seconds": round(time.perf_counter() - started, 2),
               "terms": {k: float(v.detach()) for k, v in terms.items()}, "grad_norm": total_norm, "clip_scale": scale,
               "grad": {}}
        for key, g in grads.items():
            norm = math.sqrt(flat_dot(g, g))
            row["grad"][key] = {"norm": norm, "clipped_norm": norm * scale,
                                "share": flat_dot(g, total) / max(total_norm**2, 1e-30),
                                "blank_row_norm": float(g[embed_index][model.cfg.blank_id].norm())}
        row["blank_row_step"] = float((model.embed.weight[model.cfg.blank_id].detach() - blank_row_before).norm())
        row["blank_row_norm"] = float(model.embed.weight[model.cfg.blank_id].detach().norm())
        row["probe"] = probe(model)
        if valid_every and number % valid_every == 0 and number < updates:
            scores = validator(model)
            row["valid_bleu"] = {d: scores[f"bleu_{d}"] for d in DIRECTIONS}
            row["valid_scores"], row["ema_scores"] = scores, averages.validate(validator)
            if blank_offsets:
                row["blank_offset_bleu"] = offset_bleu(model, validator, list(blank_offsets))
        rows.append(row)
        print_row(name, row)
    scores = validator(model)
    rows[-1]["valid_bleu"] = {d: scores[f"bleu_{d}"] for d in DIRECTIONS}
    rows[-1]["valid_scores"], rows[-1]["ema_scores"] = scores, averages.validate(validator)
    return {"variant": name, "loss_config": loss_config.to_dict(), "updates": rows,
            "valid_bleu_after": {d: scores[f"bleu_{d}"] for d in DIRECTIONS},
            "blank_offset_bleu_after": offset_bleu(model, validator, list(blank_offsets))}


def print_row(name: str, row: dict) -> None:
    g, p = row["grad"], row["probe"]
    parts = [f"{name:>14} step {row['step']:4d} |g| {row['grad_norm']:6.2f}"]
    for key in sorted(g):
        parts.append(f"{key} {row['terms'][key]:.3f} |g| {g[key]['norm']:.2f} sh {g[key]['share']:+.2f}")
    if "valid_bleu" in row:
        parts.append("valid BLEU " + " / ".join(f"{row['valid_bleu'][d]:.2f}" for d in DIRECTIONS))
    for d in DIRECTIONS:
        parts.append(f"{d}: blank {p[d]['argmax_blank']:.3f} P {p[d]['p_blank']:.3f} len {p[d]['out_len']:.1f}/{p[d]['ref_len']:.1f}")
    print(" | ".join(parts), flush=True)


def table(result: dict) -> str:
    """One line per variant: validation BLEU before → after, and over the continuation's updates (probe) the
    argmax-blank share and the greedy length per sentence, min–max, per direction; the aux terms' mean share."""
    lines = ["| variant | BLEU src2tgt before → after | BLEU tgt2src before → after | argmax-blank src2tgt min–max (last) "
             "| argmax-blank tgt2src min–max (last) | greedy len src2tgt min–max | greedy len tgt2src min–max "
             "| mean share of the clipped gradient (aux terms; CTC the rest) | largest drop between consecutive validations "
             "src2tgt / tgt2src | mean BLEU of the continuation's validations src2tgt / tgt2src (count) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    before = result["first_stage"]
    for v in result["variants"]:
        probes = [row["probe"] for row in v["updates"]]
        shares = {}
        for row in v["updates"]:
            for key, values in row["grad"].items():
                shares.setdefault(key, []).append(values["share"])
        aux = ", ".join(f"{k} {sum(s) / len(s):.3f}" for k, s in sorted(shares.items()) if not k.startswith(("ctc", "dag")))
        cells = [v["variant"]] + [f"{before['valid_bleu'][d]:.2f} → {v['valid_bleu_after'][d]:.2f}" for d in DIRECTIONS]
        for d in DIRECTIONS:
            values = [p[d]["argmax_blank"] for p in probes]
            cells.append(f"{min(values):.2f}–{max(values):.2f} ({values[-1]:.2f})")
        for d in DIRECTIONS:
            values = [p[d]["out_len"] for p in probes]
            cells.append(f"{min(values):.1f}–{max(values):.1f} (ref {probes[0][d]['ref_len']:.1f})")
        cells.append(aux or "-")
        drops, means = [], []
        for d in DIRECTIONS:
            series = [before["valid_bleu"][d]] + [row["valid_bleu"][d] for row in v["updates"] if "valid_bleu" in row]
            if "valid_bleu" not in v["updates"][-1]:  # a report written before rows carried their validation
                series.append(v["valid_bleu_after"][d])
            drops.append(max([a - b for a, b in zip(series, series[1:])] + [0.0]))
            means.append(sum(series[1:]) / len(series[1:]))
        cells.append(f"{drops[0]:.2f} / {drops[1]:.2f}")
        cells.append(f"{means[0]:.2f} / {means[1]:.2f} ({len(series) - 1})")
        lines.append("| " + " | ".join(cells) + " |")
    offsets = before.get("blank_offset_bleu") or {}
    if offsets:  # validation BLEU with the blank's logit lowered at decoding, first stage and after each variant
        lines += ["", "| blank logit lowered by | " + " | ".join(
            [f"first stage (step {before['steps']}) src2tgt / tgt2src"]
            + [f"{v['variant']} (step {v['updates'][-1]['step']}) src2tgt / tgt2src" for v in result["variants"]]) + " |",
            "|---|" + "---|" * (1 + len(result["variants"]))]
        for offset, scores in offsets.items():
            cells = [offset, f"{scores['src2tgt']:.2f} / {scores['tgt2src']:.2f}"]
            for v in result["variants"]:
                after = v.get("blank_offset_bleu_after", {}).get(offset)
                cells.append(f"{after['src2tgt']:.2f} / {after['tgt2src']:.2f}" if after else "-")
            lines.append("| " + " | ".join(cells) + " |")
    series_rows = []  # validations along a continuation, with each blank offset (--valid-every with --blank-offsets)
    for v in result["variants"]:
        for offset in offsets:
            points = [(before["steps"], offsets[offset])] + [
                (row["step"], row["blank_offset_bleu"][offset]) for row in v["updates"] if "blank_offset_bleu" in row]
            if "blank_offset_bleu" not in v["updates"][-1] and offset in v.get("blank_offset_bleu_after", {}):
                points.append((v["updates"][-1]["step"], v["blank_offset_bleu_after"][offset]))
            if len(points) > 2:
                series_rows.append((v["variant"], offset, points))
    if series_rows:
        lines += ["", "| variant | blank offset | validation BLEU src2tgt / tgt2src by step | largest drop src2tgt / tgt2src |",
                  "|---|---|---|---|"]
        for name, offset, points in series_rows:
            drops = [max([a[1][d] - b[1][d] for a, b in zip(points, points[1:])] + [0.0]) for d in DIRECTIONS]
            lines.append(f"| {name} | {offset} | " + ", ".join(f"{step}: {b['src2tgt']:.2f} / {b['tgt2src']:.2f}" for step, b in points)
                         + f" | {drops[0]:.2f} / {drops[1]:.2f} |")
    return "\n".join(lines)


def validation_series(result: dict) -> str:
    """Per variant, the weights as trained and each EMA of them: validation BLEU src2tgt / tgt2src at every
    validation (with the blank penalty each picked, when the validator tunes one) and the largest drop between
    consecutive validations; '' for a report without these validations."""
    first = result["first_stage"]
    lines = []
    for v in result["variants"]:
        rows = [row for row in v["updates"] if "valid_scores" in row]
        if not rows:
            continue
        weights = {"as trained": [row["valid_scores"] for row in rows]}
        for decay in rows[0]["ema_scores"]:
            weights[f"EMA {decay}"] = [row["ema_scores"][decay] for row in rows]
        if not lines:
            lines = ["| variant | weights | " + " | ".join(str(row["step"]) for row in rows)
                     + " | largest drop src2tgt / tgt2src | mean src2tgt / tgt2src |", "|---|---|" + "---|" * (len(rows) + 2)]
        for label, series in weights.items():
            points = [first.get("valid_scores", {f"bleu_{d}": first["valid_bleu"][d] for d in DIRECTIONS})] + series
            cells = []
            for scores in series:
                cell = " / ".join(f"{scores[f'bleu_{d}']:.2f}" for d in DIRECTIONS)
                if "blank_penalty_src2tgt" in scores:
                    cell += " (c " + " / ".join(f"{scores[f'blank_penalty_{d}']:g}" for d in DIRECTIONS) + ")"
                cells.append(cell)
            drops = [max([a[f"bleu_{d}"] - b[f"bleu_{d}"] for a, b in zip(points, points[1:])] + [0.0]) for d in DIRECTIONS]
            means = [sum(s[f"bleu_{d}"] for s in series) / len(series) for d in DIRECTIONS]
            lines.append(f"| {v['variant']} | {label} | " + " | ".join(cells)
                         + f" | {drops[0]:.2f} / {drops[1]:.2f} | {means[0]:.2f} / {means[1]:.2f} |")
    if lines:
        start = " / ".join(f"{first['valid_bleu'][d]:.2f}" for d in DIRECTIONS)
        lines.insert(0, f"Validation BLEU src2tgt / tgt2src at each step of the continuation (step {first['steps']}: "
                        f"{start}; drops counted from it):\n")
    return "\n".join(lines)


def summary(result: dict) -> dict:
    """Ranges over each variant's updates: total and per-term gradient norms, the blank row's step and norm,
    the largest per-update change of the blank's mean logit per direction, and the aux terms' first values."""
    out = {}
    for v in result["variants"]:
        rows = v["updates"]
        terms = sorted(rows[0]["grad"])
        entry = {"grad_norm": [min(r["grad_norm"] for r in rows), max(r["grad_norm"] for r in rows)],
                 "term_grad_norm": {k: [min(r["grad"][k]["norm"] for r in rows), max(r["grad"][k]["norm"] for r in rows)]
                                    for k in terms},
                 "blank_row_step": [min(r["blank_row_step"] for r in rows), max(r["blank_row_step"] for r in rows)],
                 "blank_row_norm_first_last": [rows[0]["blank_row_norm"], rows[-1]["blank_row_norm"]],
                 "first_values": {k: [r["terms"][k] for r in rows[:2]] for k in rows[0]["terms"] if k.startswith(("fba", "cc"))}}
        logits = {d: [result["first_stage"]["probe"][d]["blank_logit"]] + [r["probe"][d]["blank_logit"] for r in rows]
                  for d in DIRECTIONS}
        entry["blank_logit_max_step_change"] = {d: max(abs(a - b) for a, b in zip(x, x[1:])) for d, x in logits.items()}
        out[v["variant"]] = entry
    return out


def write_report(result: dict, out: Path) -> None:
    """The JSON with its table, and the table alone as Markdown beside it (same name, .md)."""
    result["table"] = table(result)
    series = validation_series(result)
    if series:
        result["table"] += "\n\n" + series
    result["summary"] = summary(result)
    out.write_text(json.dumps(result, indent=1))
    command = "python -m bench.stage2_diag " + " ".join(["--config", result["config"], *result["overrides"]])
    out.with_suffix(".md").write_text(f"{result['what']}, {result['date']}, {result['threads']} thread(s), "
                                      f"first stage {result['first_stage']['steps']} updates, then {result['updates']} "
                                      f"per variant ({command}).\n\n{result['table']}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--workdir", help="where the data stages of the config ran")
    parser.add_argument("--retable", action="store_true", help="only rewrite --out's table (JSON and .md) from its numbers")
    parser.add_argument("--out", required=True)
    parser.add_argument("--first-stage", type=int, default=None, help="default: the config's loss.aux_start_step")
    parser.add_argument("--updates", type=int, default=14)
    parser.add_argument("--variants", default="none,fba,cc,both")
    parser.add_argument("--valid-every", type=int, default=0, help="also validate every N continuation updates")
    parser.add_argument("--blank-offsets", default="", help="also validate with the blank's logit lowered by each "
                                                                "of these (comma-separated) at the first stage and after each variant")
    parser.add_argument("--blank-penalties", default="", help="validate with the train stage's tuned blank penalty: "
                        "each direction's best of these (comma-separated; evaluate.blank_penalties)")
    parser.add_argument("--ema", default="", help="also validate exponential moving averages of the weights with "
                        "these decays (comma-separated), started at the first stage's weights")
    parser.add_argument("--probe", type=int, default=100, help="validation sentences of the per-update probe")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--state", default="", help="save the first stage's state here, or load it if it exists")
    args = parser.parse_args(argv)
    if args.retable:
        result = json.loads(Path(args.out).read_text())
        write_report(result, Path(args.out))
        print(result["table"])
        print(json.dumps(result["summary"], indent=1))
        return 0
    if not args.workdir:
        parser.error("--workdir is required")
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    workdir = Path(args.workdir)
    first_stage = cfg.loss.aux_start_step if args.first_stage is None else args.first_stage
    tokenized, corpus, spm_dir = (_stage_dir(workdir, s) for s in ("tokenize", "ingest", "spm"))
    examples = load_examples(tokenized / "train")
    penalties = tuple(float(x) for x in args.blank_penalties.split(",") if x) or NO_BLANK_PENALTY
    validator = Validator({"ids": str(tokenized / "valid"), "text": str(corpus / "valid")},
                          (spm_dir / spm.MODEL_FILE).read_bytes(), cfg.train.valid_max_sentences,
                          blank_penalties=penalties)
    probe = Probe(tokenized / "valid", args.probe)
    started = time.perf_counter()
    state_path = Path(args.state) if args.state else None
    if state_path is not None and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        print(f"first stage loaded from {state_path}", flush=True)
    else:
        torch.manual_seed(cfg.train.seed)
        model = REDER(cfg.model, replace(cfg.loss, aux_start_step=10**9))
        harness = Harness(model, DuplexLoss(model), replace(cfg.train, validate_every=10**9), "cpu")
        harness.fit_examples(examples, until=first_stage)
        state = copy.deepcopy(harness.state_dict())
        print(f"first stage: {first_stage} updates in {time.perf_counter() - started:.0f} s", flush=True)
        if state_path is not None:
            torch.save(state, state_path)
    model = REDER(cfg.model, cfg.loss)
    model.load_state_dict(state["model"])
    scores = validator(model)
    offsets = tuple(float(x) for x in args.blank_offsets.split(",") if x)
    first = {"steps": first_stage, "valid_bleu": {d: scores[f"bleu_{d}"] for d in DIRECTIONS}, "valid_scores": scores,
             "probe": probe(model),
             "blank_offset_bleu": offset_bleu(model, validator, list(offsets)),
             "blank_row_norm": float(model.embed.weight[model.cfg.blank_id].detach().norm())}
    print(f"first stage: valid BLEU {first['valid_bleu']}, probe {first['probe']}", flush=True)
    result = {"what": "bench/stage2_diag.py: stage two's first updates, term by term (issue 41)",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
              "threads": args.threads, "config": args.config, "overrides": args.overrides,
              "train_pairs": len(examples), "updates": args.updates, "valid_every": args.valid_every, "probe_sentences": args.probe,
              "valid_sentences": cfg.train.valid_max_sentences, "first_stage": first, "variants": []}
    for name in args.variants.split(","):
        result["variants"].append(continue_variant(state, cfg, examples, name, VARIANTS[name], args.updates, probe,
                                                   validator, first_stage, args.valid_every, offsets,
                                                   tuple(float(x) for x in args.ema.split(",") if x)))
        print(f"{name}: valid BLEU after {result['variants'][-1]['valid_bleu_after']}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_report(result, Path(args.out))
    print(result["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
