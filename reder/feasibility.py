"""What each output head can emit from an input of a given length: the length rules the tokenize stage filters
training pairs with, the config key of each head's upsampling ratio, whether it emits blanks, and the stage key of
a config's rule. Pure Python (no torch): the tokenize stage's Ray Data actors and the pipeline's driver load this
module alone (the driver loads torch only for a stage that trains or decodes). The heads (reder/heads.py) take
their `feasible`, `ratio_name` and `emits_blank` from here."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from reder.config import ModelConfig


def ctc(input_len: int, target: list[int], ratio: float) -> bool:
    """Whether CTC can emit `target`+EOS from `input_len` pieces (+EOS) upsampled by the ratio r: a path
    needs a frame per label and a blank between adjacent equal ones."""
    repeats = sum(1 for a, b in zip(target, target[1:]) if a == b)
    return ratio * (input_len + 1) >= len(target) + 1 + repeats


def dag(input_len: int, target: list[int], ratio: float) -> bool:
    """Whether the graph over BOS + `input_len` pieces + EOS, int(λ·(input_len+2)) vertices, has one for
    each of BOS + target + EOS (repeats need nothing extra)."""
    return int(ratio * (input_len + 2)) >= len(target) + 2


RULES: dict[str, Callable[[int, list[int], float], bool]] = {"ctc": ctc, "dag": dag}  # by ModelConfig.head
RATIO_KEYS = {"ctc": "upsample_ratio", "dag": "graph_upsample_ratio"}  # the ModelConfig key of each head's ratio
# Whether a head's decoders drop blanks from its output, so that a blank penalty (REDER.blank_penalty) applies; the
# DAG's blank id is only FBA's skip token
EMITS_BLANK = {"ctc": True, "dag": False}


def rule(head: str) -> Callable[[int, list[int], float], bool]:
    """rule(input_len, target, ratio) of the head named `head` (ModelConfig.head)."""
    if head not in RULES:
        raise ValueError(f"unknown head {head!r}; known heads are {sorted(RULES)}")
    return RULES[head]


def upsample_ratio(cfg: ModelConfig) -> float:
    """The ratio the config's head upsamples its input by: r (CTC) or λ (DAG)."""
    rule(cfg.head)  # an unknown head is a ValueError
    return getattr(cfg, RATIO_KEYS[cfg.head])


def config_rule(cfg: ModelConfig) -> Callable[[int, list[int]], bool]:
    """rule(input_len, target): whether the config's head can emit target from an input of input_len pieces."""
    return partial(rule(cfg.head), ratio=upsample_ratio(cfg))


def key(cfg: ModelConfig) -> dict[str, Any]:
    """What the tokenize stage's filter depends on: part of stage directory hashes, so never change it (CTC's key
    predates the DAG head and names no head)."""
    if cfg.head == "ctc":
        return {"upsample_ratio": cfg.upsample_ratio}
    return {"head": cfg.head, RATIO_KEYS[cfg.head]: upsample_ratio(cfg)}
