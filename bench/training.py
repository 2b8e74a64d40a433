"""The in-process training loop of the GPU benchmarks (bench.distill, bench.quality): the pipeline's batching
(`token_batches`), schedule (`inverse_sqrt`), AdamW(0.9, 0.98), clipping and bf16 autocast on GPU, without
Ray — the device machines have no Ray or MLflow, and Ray's wheel is larger than what can be carried there."""
from __future__ import annotations

import time
from typing import Callable

import torch

from pipeline.train import inverse_sqrt, token_batches
from reder import EOS_ID
from reder.checkpoint import average_state_dicts
from reder.ctc import pad_batch

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def batches(source_lengths: list[int], target_lengths: list[int], max_tokens: int, seed: int = 1) -> list[list[int]]:
    """Index batches of pairs under the pipeline's token budget (its `token_batches`)."""
    return token_batches(source_lengths, target_lengths, max_tokens, seed)


def tensors(sources: list[list[int]], targets: list[list[int]], index: list[int], device: str) -> Batch:
    """Padded (src, src_lengths, tgt, tgt_lengths) of pairs `index`, EOS appended."""
    src, src_lengths = pad_batch([sources[i] + [EOS_ID] for i in index], device)
    tgt, tgt_lengths = pad_batch([targets[i] + [EOS_ID] for i in index], device)
    return src, src_lengths, tgt, tgt_lengths


class BestCheckpoints:
    """The pipeline's checkpoint averaging (train.average_best) for the in-process loop: `fit` calls it after
    every update; every `every` updates it scores the model with `score(model)` (validation BLEU) and keeps a
    copy of the best `keep` states (ties: the later one), and `average(model)` loads their element-wise mean
    (fairseq's average_checkpoints) and says which were averaged. A last update between two validations (a
    time cap stopped the run) is scored too before averaging, as the pipeline validates at its last step.
    `seconds` is the time spent scoring."""

    def __init__(self, score: Callable[[torch.nn.Module], float], every: int, keep: int) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"BestCheckpoints: every ({every}) and keep ({keep}) must be >= 1")
        self.score, self.every, self.keep = score, every, keep
        self.kept: list[tuple[float, int, dict[str, torch.Tensor]]] = []
        self.seconds, self.last = 0.0, 0

    def __call__(self, model: torch.nn.Module, step: int) -> None:
        self.last = step
        if step % self.every == 0:
            self._validate(model, step)

    def _validate(self, model: torch.nn.Module, step: int) -> None:
        started, was_training = time.perf_counter(), model.training
        model.eval()
        try:
            with torch.no_grad():
                value = float(self.score(model))
        finally:
            model.train(was_training)
        snapshot = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
        self.kept = sorted(self.kept + [(value, step, snapshot)], key=lambda kept: (-kept[0], -kept[1]))[: self.keep]
        self.seconds += time.perf_counter() - started

    def average(self, model: torch.nn.Module) -> list[dict[str, float]]:
        if self.last % self.every:  # `model` holds the last update, which no validation has seen
            self._validate(model, self.last)
        if not self.kept:
            raise ValueError("BestCheckpoints: nothing scored (it saw no update)")
        model.load_state_dict(average_state_dicts([state for _, _, state in self.kept]))
        return [{"step": step, "valid_bleu": round(value, 2)} for value, step, _ in self.kept]


def fit(model: torch.nn.Module, loss: Callable[[int, int], torch.Tensor], count: int, steps: int, lr: float,
        warmup: int, device: str, time_cap_s: float = float("inf"), state: dict | None = None,
        on_update: Callable[[torch.nn.Module, int], None] | None = None) -> dict[str, float]:
    """Train until update `steps` with `loss(step, batch_number)` (or stop early if `time_cap_s` runs out):
    returns the updates done by this call, its seconds and the last loss. `state`, a dict of the caller's,
    carries the optimizer, the schedule and the update count from one call to the next: given one that a
    previous call filled, training goes on where it stopped (a deep copy of it forks the run). `on_update`
    (e.g. a BestCheckpoints) is called with the model and the update count after every update."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: inverse_sqrt(step, lr, warmup, 1e-7) / lr)
    step = 0
    if state:
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step = state["step"]
    started, value, first = time.perf_counter(), float("nan"), step
    while step < steps and time.perf_counter() - started < time_cap_s:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            total = loss(step, step % count)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        value = float(total.detach())
        if on_update is not None:
            on_update(model, step)
    model.eval()
    if state is not None:
        state.update(optimizer=optimizer.state_dict(), schedule=schedule.state_dict(), step=step)
    return {"steps": step - first, "seconds": round(time.perf_counter() - started, 1), "last_loss": round(value, 4)}
