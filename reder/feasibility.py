"""What each output head can emit from an input of a given length: the length rules the tokenize stage filters
training pairs with. Pure Python (no torch): the tokenize stage's Ray Data actors load this module alone. The heads
(reder/heads.py) expose each rule as their `feasible`."""
from __future__ import annotations

from typing import Callable


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


def rule(head: str) -> Callable[[int, list[int], float], bool]:
    """rule(input_len, target, ratio) of the head named `head` (ModelConfig.head)."""
    if head not in RULES:
        raise ValueError(f"unknown head {head!r}; known heads are {sorted(RULES)}")
    return RULES[head]
