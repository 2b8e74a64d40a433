"""The in-process training loop of the GPU benchmarks (bench.distill, bench.quality): the pipeline's batching
(`token_batches`), schedule (`inverse_sqrt`), AdamW(0.9, 0.98), clipping and bf16 autocast on GPU, without
Ray — the device machines have no Ray or MLflow, and Ray's wheel is larger than what can be carried there."""
from __future__ import annotations

import time
from typing import Callable

import torch

from pipeline.train import inverse_sqrt, token_batches
from reder import EOS_ID
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


def fit(model: torch.nn.Module, loss: Callable[[int, int], torch.Tensor], count: int, steps: int, lr: float,
        warmup: int, device: str, time_cap_s: float = float("inf"), state: dict | None = None) -> dict[str, float]:
    """Train until update `steps` with `loss(step, batch_number)` (or stop early if `time_cap_s` runs out):
    returns the updates done by this call, its seconds and the last loss. `state`, a dict of the caller's,
    carries the optimizer, the schedule and the update count from one call to the next: given one that a
    previous call filled, training goes on where it stopped (a deep copy of it forks the run)."""
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
    model.eval()
    if state is not None:
        state.update(optimizer=optimizer.state_dict(), schedule=schedule.state_dict(), step=step)
    return {"steps": step - first, "seconds": round(time.perf_counter() - started, 1), "last_loss": round(value, 4)}
