"""Translation metrics shared by training (validation), distillation and evaluation: a low module that
imports no stage, so the train stage's validation no longer imports the evaluate stage that runs after it."""
from __future__ import annotations

from typing import Any

import sacrebleu


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against one reference each, with signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score, "bleu_signature": str(bleu.get_signature()),
            "chrf": chrf.corpus_score(hypotheses, [references]).score, "chrf_signature": str(chrf.get_signature())}


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacreBLEU BLEU alone (what `corpus_scores` gives as "bleu"), for scoring many settings of one decoder."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score


def best_setting(scores: dict[float, float]) -> float:
    """The setting of a decoding knob (a grid point) with the highest score; of equals the one nearest 0, the
    knob's off position, then the smaller (the self-reranking weight, the CTC blank penalty)."""
    return max(scores, key=lambda setting: (scores[setting], -abs(setting), -setting))
