"""Translation metrics shared by training (validation), distillation and evaluation: a low module that
imports no stage, so the train stage's validation no longer imports the evaluate stage that runs after it."""
from __future__ import annotations

from typing import Any

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
