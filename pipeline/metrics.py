"""Translation metrics shared by training (validation), distillation and evaluation: a low module that
imports no stage, so the train stage's validation no longer imports the evaluate stage that runs after it."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import sacrebleu


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against one reference each, with signatures, and the
    hypotheses' length over the references' in BLEU's tokens (`length_ratio`: below 1 the brevity penalty)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    score = bleu.corpus_score(hypotheses, [references])
    return {"bleu": score.score, "bleu_signature": str(bleu.get_signature()), "length_ratio": _ratio(score),
            "chrf": chrf.corpus_score(hypotheses, [references]).score, "chrf_signature": str(chrf.get_signature())}


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, float]:
    """sacreBLEU BLEU and the length ratio alone (`corpus_scores`' "bleu" and "length_ratio"), for scoring many
    settings of one decoder."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    score = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references])
    return score.score, _ratio(score)


def _ratio(score: Any) -> float:
    return score.sys_len / max(score.ref_len, 1)


def best_setting(scores: dict[float, float]) -> float:
    """The setting of a decoding knob (a grid point) with the highest score; of equals the one nearest 0, the
    knob's off position, then the smaller (the self-reranking weight, the CTC blank penalty)."""
    return max(scores, key=lambda setting: (scores[setting], -abs(setting), -setting))


# What an evaluation reports of each test set to MLflow (`<set>_<key>`): greedy BLEU and chrF both ways, both round
# trips, and how well the round-trip confidence ranks the translations (Spearman's ρ with sentence chrF).
HEADLINE = ("bleu_src2tgt", "bleu_tgt2src", "chrf_src2tgt", "chrf_tgt2src", "roundtrip_bleu_src", "roundtrip_bleu_tgt",
            "confidence_spearman_src2tgt", "confidence_spearman_tgt2src")
SHOWN_DECIMALS = 2  # BLEU and chrF as they are reported (and as MLflow's runs table has room for)


def shown(key: str, value: float) -> float:
    """A metric as MLflow records it: BLEU and chrF (a name holding `bleu` or `chrf`) rounded to two decimals, as
    BLEU is reported, so the runs table shows 11.84 rather than 11.8404722… cut by its column; anything else as
    is. results.json keeps the exact values."""
    name = key.rsplit(".", 1)[-1].lower()
    return round(value, SHOWN_DECIMALS) if "bleu" in name or "chrf" in name else value


def test_splits(results: dict[str, Any]) -> list[str]:
    """The sets of an evaluation's results.json that get their own metrics in MLflow (`<set>_bleu_src2tgt`, ...):
    the headline split and every named test set; the ingested train and valid splits are in results.json only."""
    return [split for split in results.get("sets", {results["split"]: None})
            if split == results["split"] or split not in ("train", "valid")]


def sentence_scores(hypotheses: list[str], references: list[str]) -> tuple[list[float], list[float]]:
    """sacreBLEU's sentence BLEU (effective order, as sacreBLEU advises for single sentences) and sentence chrF of
    each hypothesis against its reference, exact (a translations table shows them at SHOWN_DECIMALS)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(effective_order=True), sacrebleu.metrics.CHRF()
    return ([bleu.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)],
            [chrf.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)])


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, ties given their average rank (−inf ranks lowest)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    result = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        result[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ: Pearson's correlation of the (tie-averaged) ranks."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator else float("nan")


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's τ-b: (concordant − discordant) / sqrt((pairs − ties in a) (pairs − ties in b)), over all pairs
    (compared by rank, so −inf, a value the model could not give, is the lowest and ties with its equals). All
    pairs at once: n² memory, for test sets of a few thousand sentences."""
    a, b = ranks(a), ranks(b)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu(np.ones((len(a), len(a)), dtype=bool), k=1)
    da, db = da[upper], db[upper]
    untied_a, untied_b = float((da != 0).sum()), float((db != 0).sum())
    denominator = math.sqrt(untied_a * untied_b)
    return float((da * db).sum() / denominator) if denominator else float("nan")
