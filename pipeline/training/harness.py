"""The training core, without Ray: the pipeline's Ray Train workers (pipeline/training/trainloop.py) and the GPU
benchmarks (bench/quality.py, bench/distill.py; the device machines have no Ray) train through it.

A `Harness` holds a model, its objective (the model itself or a wrapper such as `DuplexLoss`, maybe
DDP-wrapped) and a `TrainConfig`, and owns the optimisation: AdamW(`adam_betas`, `adam_eps`,
`weight_decay`) with fairseq's inverse-sqrt schedule, one `update()` over `update_freq` micro-batches
(gradient accumulation; DDP synchronises on the last one only, through the objective's `no_sync`), gradient
clipping, bf16 autocast on CUDA. `fit()` is driven by an iterator of micro-batches — (epoch, index in the
epoch, examples) — and reports through hooks: every `log_every` steps `on_report(metrics, None)` with the
window's mean loss terms, grad norm, lr and tokens/s; every `validate_every` steps and at the last one
(`max_steps`, or the step a time cap stopped at) the model is scored by `validate(model)` and
`on_report(metrics, state)` gets the state to checkpoint. With `keep_best` the harness keeps the best
validated states in memory (the pipeline's checkpoints live in Ray's storage instead) and `average()`
loads the element-wise mean of the best `average_best` (fairseq's average_checkpoints). `state_dict()` /
`load_state_dict()` carry what a run resumes from: model, optimizer, schedule, step, epoch, the next batch
and the history; a resumed run is the uninterrupted one, and a deep copy of a state forks a run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Optional, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.config import TrainConfig
from reder import EOS_ID
from reder.checkpoint import average_state_dicts, upgrade_state_dict
from reder.ctc import pad_batch

SCORE = "valid_bleu"  # what validation returns and checkpoints are ranked by (higher is better)

Example = tuple[list[int], ...]  # (src, tgt), or with KD (src, tgt, kd_tgt, kd_src): token ids, no EOS
MicroBatch = tuple[int, int, list[Example]]  # (epoch, index of the batch in its epoch, examples)
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # src, src_lengths, tgt, tgt_lengths
Validate = Callable[[torch.nn.Module], dict[str, float]]
Report = Callable[[dict[str, Any], Optional[dict[str, Any]]], None]
T = TypeVar("T")


def inverse_sqrt(step: int, lr: float, warmup: int, init_lr: float) -> float:
    """fairseq's inverse_sqrt: linear warm-up from init_lr to lr over `warmup` steps, then lr·√(warmup/step)."""
    step = max(step, 1)
    if warmup > 0 and step < warmup:
        return init_lr + step * (lr - init_lr) / warmup
    return lr * math.sqrt(max(warmup, 1) / step)


def learning_rate(step: int, cfg: TrainConfig, time_progress: float = 0.0) -> float:
    """The learning rate after `step` updates. Without `warmup_fraction` and with `lr_scheduler` inverse_sqrt,
    fairseq's `inverse_sqrt` by steps. Otherwise it follows the run's progress p = max(step / max_steps,
    `time_progress`) (the fraction of `max_time` spent): a linear warm-up from warmup_init_lr to lr over the
    first `warmup_fraction` f of the run (else over `warmup_steps`), then lr·√(f/p) (inverse_sqrt) or a linear
    decay to 0 at p = 1 (linear: fairseq's polynomial_decay of power 1), so a run budgeted by time warms up and
    decays over its budget, however many updates the card makes of it."""
    fraction = cfg.warmup_fraction
    if not fraction and cfg.lr_scheduler == "inverse_sqrt":
        return inverse_sqrt(step, cfg.lr, cfg.warmup_steps, cfg.warmup_init_lr)
    progress = min(max(step / cfg.max_steps, time_progress), 1.0)
    if fraction:
        if progress < fraction:
            return cfg.warmup_init_lr + (cfg.lr - cfg.warmup_init_lr) * progress / fraction
        if cfg.lr_scheduler == "inverse_sqrt":
            return cfg.lr * math.sqrt(fraction / max(progress, fraction))
        return cfg.lr * (1.0 - progress) / (1.0 - fraction)
    if step < cfg.warmup_steps:  # linear decay after a warm-up by steps
        return inverse_sqrt(step, cfg.lr, cfg.warmup_steps, cfg.warmup_init_lr)
    start = min(cfg.warmup_steps / cfg.max_steps, 0.5)  # the decay's start as a fraction of the run
    return cfg.lr * max(0.0, 1.0 - progress) / (1.0 - start) if progress > start else cfg.lr


def batch_size_tokens(sentences: int, longest_src: int, longest_tgt: int, count: str = "sum") -> int:
    """A batch's tokens as `max_tokens` counts them (TrainConfig.batch_tokens): sentences × (longest source +
    longest target) with count "sum", sentences × max(longest source, longest target) with "max" (fairseq's)."""
    if count == "sum":
        return sentences * (longest_src + longest_tgt)
    if count == "max":
        return sentences * max(longest_src, longest_tgt)
    raise ValueError(f"count must be 'sum' or 'max', got {count!r}")


def token_batches(src_lengths: Sequence[int] | np.ndarray, tgt_lengths: Sequence[int] | np.ndarray, max_tokens: int,
                  seed: int, count: str = "sum") -> list[np.ndarray]:
    """fairseq-style buckets: indices sorted by length (ties in random order), cut so that the batch's tokens
    (EOS included, counted by `batch_size_tokens(..., count)`) ≤ max_tokens, batches shuffled; each batch an
    array of indices. A pair longer than max_tokens on its own gets a batch of one. Vectorised (numpy's
    Generator seeded with `seed`): an epoch of 2.9M pairs is bucketed in about 1 s, where the list-based version
    it replaced took 9 s (docs/results/training.md, "The train stage's start at 100×")."""
    batch_size_tokens(0, 0, 0, count)  # an unknown convention fails here, not at the first full batch
    rng = np.random.default_rng(seed)
    src = np.asarray(src_lengths, dtype=np.int64) + 1  # with EOS
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    order = rng.permutation(len(src))
    if not len(order):
        return []
    key = tgt * (int(src.max(initial=0)) + 1) + src  # by (target, source) length; a stable sort keeps ties shuffled
    order = order[np.argsort(key[order], kind="stable")]
    batches = np.split(order, _cuts(src[order], tgt[order], max_tokens, count))
    return [batches[i] for i in rng.permutation(len(batches))]


def _cuts(src: np.ndarray, tgt: np.ndarray, max_tokens: int, count: str) -> list[int]:
    """Where the batches of pairs in this order start (the first excepted): a batch takes pairs while its
    tokens stay within max_tokens, and always its first pair. The first k+1 pairs cost at least (k+1)·c, c the
    first pair's own cost, so the cut lies within max_tokens // c + 1 pairs: only that window is looked at."""
    cuts, start, n = [], 0, len(src)
    while True:
        first = src[start] + tgt[start] if count == "sum" else max(src[start], tgt[start])
        stop = min(n, start + max_tokens // first + 2)
        longest_src = np.maximum.accumulate(src[start:stop])
        longest_tgt = np.maximum.accumulate(tgt[start:stop])
        sentences = np.arange(1, stop - start + 1)
        cost = sentences * (longest_src + longest_tgt if count == "sum" else np.maximum(longest_src, longest_tgt))
        over = np.flatnonzero(cost[1:] > max_tokens)
        if not len(over):  # the window reached the end of the pairs
            return cuts
        start += int(over[0]) + 1
        cuts.append(start)


EXAMPLE_COLUMNS = ("src_ids", "tgt_ids", "kd_tgt_ids", "kd_src_ids")  # an Example's fields, as split columns


class ExampleTable:
    """Examples held as flat token arrays, one per column of EXAMPLE_COLUMNS present (src_ids, tgt_ids, with KD
    also kd_tgt_ids, kd_src_ids), rather than Python lists: 4 bytes a token instead of ~36, built from Arrow
    columns without a Python object per token. `rows(indices)` gives the Examples of a batch."""

    def __init__(self, table: pa.Table) -> None:
        names = [name for name in EXAMPLE_COLUMNS if name in table.column_names]
        if names[:2] != list(EXAMPLE_COLUMNS[:2]) or len(names) == 3:
            raise ValueError(f"examples need the columns src_ids, tgt_ids (and with KD kd_tgt_ids, kd_src_ids), "
                             f"got {table.column_names}")
        self.columns: list[tuple[np.ndarray, np.ndarray]] = []  # (tokens, offsets) per column
        for name in names:
            column = table.column(name)
            lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            tokens = pc.list_flatten(column).to_numpy(zero_copy_only=False) if len(column) else np.zeros(0, np.int32)
            self.columns.append((tokens, offsets))

    def __len__(self) -> int:
        return len(self.columns[0][1]) - 1

    def lengths(self, field: int) -> np.ndarray:
        """The token count of every example's field `field` (0 src, 1 tgt, 2 kd_tgt, 3 kd_src)."""
        return np.diff(self.columns[field][1])

    def rows(self, indices: Sequence[int] | np.ndarray) -> list[Example]:
        """The Examples at `indices`, in that order."""
        fields = ([tokens[offsets[i]:offsets[i + 1]].tolist() for i in indices] for tokens, offsets in self.columns)
        return list(zip(*fields))


def bucket_lengths(examples: Sequence[Example] | ExampleTable) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths that batching counts: a KD example's longer variant of each side."""
    if isinstance(examples, ExampleTable):
        kd = len(examples.columns) == 4
        src, tgt = examples.lengths(0), examples.lengths(1)
        return (np.maximum(src, examples.lengths(3)), np.maximum(tgt, examples.lengths(2))) if kd else (src, tgt)
    src = [max(len(e[0]), len(e[3])) if len(e) == 4 else len(e[0]) for e in examples]
    tgt = [max(len(e[1]), len(e[2])) if len(e) == 4 else len(e[1]) for e in examples]
    return np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64)


class EpochBatches(Sequence):
    """One epoch's micro-batches over `examples` (a list or an ExampleTable): batch i's Examples are gathered
    when it is read, so an epoch holds only indices. A slice is the epoch cut short."""

    def __init__(self, examples: Sequence[Example] | ExampleTable, order: list[np.ndarray]) -> None:
        self.examples, self.order = examples, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return EpochBatches(self.examples, self.order[index])
        batch = self.order[index]
        if isinstance(self.examples, ExampleTable):
            return self.examples.rows(batch)
        return [self.examples[i] for i in batch]


def epoch_batches(examples: Sequence[Example] | ExampleTable, max_tokens: int, seed: int, epoch: int,
                  rank: int = 0, count: str = "sum") -> EpochBatches:
    """One epoch's micro-batches of `examples` (token_batches counting by `count`, reshuffled per seed, epoch
    and rank); a KD example is bucketed by its longer variant of each side."""
    src_lengths, tgt_lengths = bucket_lengths(examples)
    return EpochBatches(examples, token_batches(src_lengths, tgt_lengths, max_tokens,
                                                seed * 100_003 + epoch * 1_009 + rank, count))


def micro_batches(epochs: Callable[[int], Sequence[list[Example]]], epoch: int = 0, skip: int = 0) -> Iterator[MicroBatch]:
    """Endless (epoch, index, examples) over `epochs(e)`, the batches of epoch e, from `skip` batches into `epoch`."""
    while True:
        batches = epochs(epoch)
        if not batches:
            raise RuntimeError(f"epoch {epoch} has no batch (an empty shard: use fewer workers or more data)")
        for index in range(skip, len(batches)):
            yield epoch, index, batches[index]
        epoch, skip = epoch + 1, 0


def _tensors(pairs: list, device: torch.device, pin: bool) -> Batch:
    """(src, src_lengths, tgt, tgt_lengths) of (source, target) id lists, EOS appended, built on the host (pinned
    with `pin`) and moved to `device` without blocking the host."""
    src, src_lengths = pad_batch([s for s, _ in pairs], end=EOS_ID, pin_memory=pin)
    tgt, tgt_lengths = pad_batch([t for _, t in pairs], end=EOS_ID, pin_memory=pin)
    return tuple(t.to(device, non_blocking=True) for t in (src, src_lengths, tgt, tgt_lengths))  # type: ignore[return-value]


def passes(examples: list[Example], device: torch.device | str, pin: bool = False) -> tuple[Batch, Optional[Batch]]:
    """The tensors of one micro-batch: (src, src_lengths, tgt, tgt_lengths) for both directions, or with KD
    examples src2tgt's (x, teacher(x)) and tgt2src's own (teacher(y), y) batch (DuplexLoss.tgt2src_batch).
    `pin`: built in pinned host memory (for an asynchronous copy to a CUDA device)."""
    device = torch.device(device)
    if len(examples[0]) == 2:
        return _tensors(examples, device, pin), None
    forward = _tensors([(src, kd_tgt) for src, _, kd_tgt, _ in examples], device, pin)
    return forward, _tensors([(kd_src, tgt) for _, tgt, _, kd_src in examples], device, pin)


Prepared = tuple[Batch, Optional[Batch], int]  # a micro-batch's `passes` on the host and the tokens the objective reads
PREFETCH = 2  # updates whose micro-batches fit's prefetch thread builds ahead of the one training


class _Failed:
    """What the prefetch thread raised, handed to the training thread in the batches' order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def distributed() -> bool:
    """Whether this process is one of several DDP ranks."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def device_name(device: torch.device) -> str:
    """The card (CUDA) or the CPU a run trained on, for its records: a run stopped by time depends on it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def all_reduce(value: float, op: str, group: Any = None) -> float:
    """`value` summed ("sum"), minimised ("min") or maximised ("max") over the DDP ranks (of process group
    `group`, default the default group); itself outside torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op={"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}[op],
                    group=group)
    return float(tensor.item())


def select_best(scored: list[tuple[float, int, T]], count: int) -> list[tuple[float, int, T]]:
    """The `count` best (score, step, checkpoint) by score, best first; a tie goes to the later step. A step scored
    twice (a run resumed at its end validates its last update again: the same weights) counts once."""
    ranked, steps = [], set()
    for entry in sorted(scored, key=lambda entry: (-entry[0], -entry[1])):
        if entry[1] not in steps:
            steps.add(entry[1])
            ranked.append(entry)
    return ranked[:count]


RANK_TOKENS_PER_S = "rank_tokens_per_s"


def clip_gradients(model: torch.nn.Module, clip_norm: float) -> dict[str, torch.Tensor]:
    """Clip the gradients to norm `clip_norm` (0: no clipping); their norms before clipping, as device tensors:
    {"grad_norm": norm}. A model made of separately trained parts (a `clip_groups()` method: name → module, e.g.
    the two teachers of `trainloop.ModelPair`) has each part clipped on its own, as separate runs would clip it,
    with its norm as `grad_norm_<name>`; `grad_norm` is then the norm over all parts."""
    clip = clip_norm if clip_norm > 0 else math.inf
    groups = model.clip_groups() if hasattr(model, "clip_groups") else {}
    if not groups:
        return {"grad_norm": torch.nn.utils.clip_grad_norm_(model.parameters(), clip)}
    norms = {f"grad_norm_{name}": torch.nn.utils.clip_grad_norm_(part.parameters(), clip) for name, part in groups.items()}
    return {"grad_norm": torch.linalg.vector_norm(torch.stack(list(norms.values()))), **norms}


class _Window:
    """One reporting window: sums of the loss terms and grad norms per update, tokens, wall time. Each term is
    averaged over the updates that computed it: an auxiliary term that switched on inside the window (absent
    from the updates before, REDER.loss) is its mean while on, not diluted by the updates without it. The sums
    stay device tensors until `metrics` reads them all at once: one host-device sync per window, not per term
    and update."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.sums: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.tokens, self.started = 0, time.perf_counter()

    def add(self, update: dict[str, Any]) -> None:
        for name, value in update.items():
            if name != "tokens":
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
        self.tokens += int(update["tokens"])

    def metrics(self) -> dict[str, float]:
        """The window's means and rates; none for a window without updates (a resumed run reporting its end)."""
        names = list(self.sums)
        if not names:
            return {}
        tensors = [name for name in names if isinstance(self.sums[name], torch.Tensor)]
        read = dict(zip(tensors, torch.stack([self.sums[name].double() for name in tensors]).tolist())) if tensors else {}
        seconds = time.perf_counter() - self.started
        means = {name if name.startswith("grad_norm") else f"train_{name}": float(read.get(name, self.sums[name])) / self.counts[name]
                 for name in names}
        return {**means, "tokens_per_s": all_reduce(self.tokens, "sum") / max(seconds, 1e-9),
                RANK_TOKENS_PER_S: self.tokens / max(seconds, 1e-9)}  # this rank's own: a slow host shows


def compile_branches(model: torch.nn.Module) -> int:
    """`torch.compile` (in place) REDER's attention and feed-forward branches, pure functions of their input
    that the trunk calls forward and again in the reversible backward; returns how many. The rest stays eager:
    the reversible steps' custom autograd, the RNG capture and the data-dependent CTC pieces would break its
    graph. Shapes are dynamic (every batch has its own length); each branch is two graphs, with and without
    gradients, its input made contiguous (without that, ten graphs for the two branches: one per layout too)."""
    from reder.layers import AttentionBranch, DuplexLayer, FeedForwardBranch

    branches = [module for module in model.modules() if isinstance(module, (AttentionBranch, FeedForwardBranch))]
    if not branches:
        raise ValueError(f"train.compile compiles REDER's branches; {type(model).__name__} has none")
    for branch in branches:
        branch.compile(dynamic=True)
    for layer in model.modules():
        if isinstance(layer, DuplexLayer):
            layer.contiguous_branch_inputs = True  # one layout: no compile per stride (DuplexLayer's note)
    return len(branches)


class Harness:
    """The training loop of one model (see the module doc). `validate(model)` returns scores with
    `valid_bleu` (it runs in eval mode without gradients); `on_step(step)` runs after every update."""

    def __init__(self, model: torch.nn.Module, objective: torch.nn.Module, cfg: TrainConfig,
                 device: torch.device | str, validate: Optional[Validate] = None, on_report: Optional[Report] = None,
                 on_step: Optional[Callable[[int], None]] = None, keep_best: bool = False) -> None:
        self.model, self.objective, self.cfg, self.device = model, objective, cfg, torch.device(device)
        self.validate, self.on_report, self.on_step = validate, on_report, on_step
        self.bf16 = cfg.bf16 and self.device.type == "cuda"
        if cfg.compile:
            compile_branches(model)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                           eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                                           fused=True if self.device.type == "cuda" else None)  # one kernel per step
        # Training seconds of the run so far (updates and validations, summed over resumes: max_time counts
        # them), and the plateau count of `patience`: the best validation score and the validations since it.
        self.elapsed, self.best_score, self.bad_validations = 0.0, -math.inf, 0
        # The seconds the schedule spans in a run without max_time that a time cap stops (the last training stage
        # of a budgeted pipeline run: its share of the budget): the run's seconds at this call's start plus the
        # cap, set by `fit`; 0 = none, the schedule then follows the steps alone.
        self.horizon = 0.0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: learning_rate(step, cfg, self.time_progress) / cfg.lr)
        self.step = self.epoch = self.next_batch = 0
        self.stopped_by: Optional[str] = None  # why the last fit ended: max_steps, max_time, time_cap, patience
        self.run_facts: dict[str, Any] = {}  # the caller's facts of the run (too_long), in its last report
        self.phase_starts: dict[str, int] = {}  # a loss phase started by fraction (`_start_phases`): its update
        self.history: list[dict[str, Any]] = []
        self.resumed_from: Optional[int] = None
        self.best: Optional[list[tuple[float, int, dict[str, torch.Tensor]]]] = [] if keep_best else None
        self.validated_step, self.validation_seconds = -1, 0.0
        self._window = _Window()

    def update(self, batches: list[list[Example]]) -> dict[str, Any]:
        """One optimizer update over micro-batches (their gradients accumulated, each loss divided by their
        count): the mean of each loss term and the gradient norm before clipping, as 0-dim tensors on the device
        (float64; reading one syncs host and device: `_Window` reads a window's at once), and the tokens seen."""
        return self._update([self._prepare(examples) for examples in batches])

    def _prepare(self, examples: list[Example]) -> Prepared:
        """A micro-batch's tensors on the host (pinned when the device is CUDA) and its tokens, counted from the
        host's lengths (`.numpy()`: a device tensor would fail here rather than sync)."""
        batch, reverse = passes(examples, "cpu", pin=self.device.type == "cuda")
        tokens = sum(int(b[1].numpy().sum() + b[3].numpy().sum()) for b in self._read(batch, reverse))
        return batch, reverse, tokens

    def _update(self, prepared: list[Prepared]) -> dict[str, Any]:
        """`update` on micro-batches already on the host: no host-device sync (the copies do not block)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        move = lambda batch: tuple(t.to(self.device, non_blocking=True) for t in batch)  # noqa: E731
        for number, (host_batch, host_reverse, _) in enumerate(prepared):
            batch, reverse = move(host_batch), None if host_reverse is None else move(host_reverse)
            # DDP all-reduces gradients in backward: only the last micro-batch's needs to.
            accumulate = number < len(prepared) - 1 and hasattr(self.objective, "no_sync")
            with self.objective.no_sync() if accumulate else contextlib.nullcontext():
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    terms = self.objective(*batch, self.step, tgt2src_batch=reverse)
                (terms["total"] / len(prepared)).backward()
            for name, value in terms.items():
                sums[name] = sums.get(name, 0.0) + value.detach().double() / len(prepared)
        norms = clip_gradients(self.model, self.cfg.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {**sums, **{name: norm.detach().double() for name, norm in norms.items()},
                "tokens": sum(tokens for _, _, tokens in prepared)}

    def _ahead(self, batches: Iterator[MicroBatch]) -> Iterator[tuple[tuple[int, int], list[Prepared]]]:
        """fit's updates from `batches`: (the position after the update, its micro-batches `_prepare`d), built
        PREFETCH updates ahead on a thread, in order. A failure of the thread is raised here, where the
        training reaches it; closing this generator (fit does, when it ends) stops and joins the thread."""
        queue_: queue.Queue = queue.Queue(maxsize=PREFETCH)
        stop = threading.Event()

        def hand_over(item: Any) -> None:
            while not stop.is_set():
                try:
                    return queue_.put(item, timeout=0.1)
                except queue.Full:
                    continue

        def build() -> None:
            try:
                while not stop.is_set():
                    pulled = [next(batches) for _ in range(self.cfg.update_freq)]
                    hand_over(((pulled[-1][0], pulled[-1][1] + 1), [self._prepare(examples) for _, _, examples in pulled]))
            except BaseException as error:  # noqa: BLE001 - raised in the training thread instead
                hand_over(_Failed(error))

        thread = threading.Thread(target=build, name="harness-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = queue_.get()
                if isinstance(item, _Failed):
                    if isinstance(item.error, StopIteration):  # a finite iterator ran out: as next() would
                        return
                    raise item.error
                yield item
        finally:
            stop.set()
            thread.join()

    def _read(self, batch: Batch, reverse: Optional[Batch]) -> tuple[Batch, ...]:
        """The batches of a micro-batch the objective trains on: both, or the one a one-direction objective's
        `reads` names (a CMLM with KD reads only its direction's pairs)."""
        reads = getattr(self._owner, "reads", None)
        return (reads(batch, reverse),) if reads else tuple(b for b in (batch, reverse) if b is not None)

    @property
    def time_span(self) -> float:
        """The seconds the run's schedule spans: `max_time`, or without it the time cap's `horizon` (0: neither,
        the schedule follows the steps)."""
        return self.cfg.max_time or self.horizon

    @property
    def time_progress(self) -> float:
        """The fraction of `time_span` spent (0 without one): the schedule's clock (`learning_rate`)."""
        return self.elapsed / self.time_span if self.time_span else 0.0

    def fit(self, batches: Iterator[MicroBatch], until: Optional[int] = None,
            time_cap_s: float = math.inf) -> dict[str, Any]:
        """Train from `batches` (which must start at `position`) to step `until` (a pause: no validation
        there) or `max_steps`, or until the run's training time reaches `max_time` (summed over resumes) or
        this call's reaches `time_cap_s`, or `patience` validations in a row bring no new best (at least one
        update); a run that ends is validated at its last update, and `stopped_by` says why it ended. Without
        `max_time`, a finite `time_cap_s` is the span the schedule's warm-up and decay follow (`horizon`). The
        clock is read after every update in one process; with DDP ranks every `log_every` updates, as the
        slowest rank's (an all-reduce), so that every rank stops at the same update and follows the same
        learning rate. Returns this call's updates, seconds, last loss and stop; the model is left in eval mode."""
        stop = self.cfg.max_steps if until is None else min(until, self.cfg.max_steps)
        started, first, last_loss, base = time.perf_counter(), self.step, math.nan, self.elapsed
        if not self.cfg.max_time and math.isfinite(time_cap_s):
            self.horizon = base + max(time_cap_s, 0.0)
        clock = lambda: all_reduce(base + time.perf_counter() - started, "max")  # noqa: E731 - the run's seconds
        several = distributed()
        self._window.restart()
        self.stopped_by = None
        if until is None and self.resumed_from == self.step:
            self.stopped_by = self._ended()
            if self.stopped_by is not None:  # resumed after its end (stopped before its stage published): the end is
                self._report(validate=True)  # reported again, so that the latest checkpoint's history has this restart
        self._start_phases()  # a resumed run past its phase's start: on from its first update
        ahead = self._ahead(batches)  # micro-batches built on a thread; the position is that of the update trained
        while self.step < stop and self.stopped_by is None:
            (self.epoch, self.next_batch), prepared = next(ahead)
            result = self._update(prepared)
            # when this worker's updates began and last ended (wall clock): the stage's timeline (raytrain.timeline)
            now = round(time.time(), 3)
            self.run_facts.setdefault("first_update_at", now)
            self.run_facts["last_update_at"] = now
            last_loss = result["total"]
            self._window.add(result)
            read_clock = not several or self.step % self.cfg.log_every == 0
            if read_clock:
                self.elapsed = clock()
                self.stopped_by = self._out_of_time(self.elapsed - base, time_cap_s)
            if self.stopped_by is None and self.step == self.cfg.max_steps:
                self.stopped_by = "max_steps"
            validate = self.step % self.cfg.validate_every == 0 or self.stopped_by is not None
            if validate or self.step % self.cfg.log_every == 0:
                self._report(validate)
            if self.on_step is not None:
                self.on_step(self.step)
            if read_clock:  # again, with the validation: the next update's learning rate sees all time spent
                self.elapsed = clock()
                self._start_phases()
        ahead.close()
        self.elapsed = clock()  # a pause keeps all it spent
        self.model.eval()
        return {"steps": self.step - first, "seconds": round(time.perf_counter() - started, 1),
                "last_loss": round(float(last_loss), 4), "stopped_by": self.stopped_by}

    def _start_phases(self) -> None:
        """A loss phase whose start is a fraction of the run (`loss.nmla_start_fraction` of a DuplexLoss) gets its
        start step once the run's progress reaches it: the fraction of max_time (or of the time cap's `horizon`)
        spent when the run is budgeted by time, else of max_steps; the next update is the phase's first. Read
        where every DDP rank sees the same progress (after the clock's all-reduce), so that all switch at the same
        update. The objective's config is replaced; the start is kept in the run's state (`load_state_dict` puts
        it back, so a resumed run keeps the update where it started; a run resumed before it finds it here)."""
        fraction = getattr(getattr(self._owner, "config", None), "nmla_start_fraction", None)
        if fraction is None:
            return
        progress = self.time_progress if self.time_span else self.step / self.cfg.max_steps
        if progress >= fraction:
            self._start_nmla(self.step)

    @property
    def _owner(self) -> torch.nn.Module:
        """The objective itself (DDP wraps it)."""
        return getattr(self.objective, "module", self.objective)

    def _start_nmla(self, step: int) -> None:
        """NMLA on from update `step` (the objective's config's fraction replaced by that step)."""
        config = self._owner.config
        self._owner.config = dataclasses.replace(config, nmla_start_step=step, nmla_start_fraction=None)
        self.phase_starts["nmla_start_step"] = step

    def _ended(self) -> Optional[str]:
        """Why a resumed run had already ended at its checkpoint (its steps, its time or its patience spent), if it had."""
        if self.step >= self.cfg.max_steps:
            return "max_steps"
        if self.cfg.max_time and self.elapsed >= self.cfg.max_time:
            return "max_time"
        return "patience" if self.cfg.patience and self.bad_validations >= self.cfg.patience else None

    def _out_of_time(self, call_seconds: float, time_cap_s: float) -> Optional[str]:
        if self.cfg.max_time and self.elapsed >= self.cfg.max_time:
            return "max_time"
        return "time_cap" if call_seconds >= time_cap_s else None

    def fit_examples(self, examples: Sequence[Example] | ExampleTable, until: Optional[int] = None,
                     time_cap_s: float = math.inf) -> dict[str, float]:
        """`fit` on an in-memory training set (a list or an ExampleTable): `epoch_batches` of `examples` under the
        config's seed."""
        epochs = lambda epoch: epoch_batches(examples, self.cfg.max_tokens, self.cfg.seed, epoch,  # noqa: E731
                                             count=self.cfg.batch_tokens)
        return self.fit(self.stream(epochs), until, time_cap_s)

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, index of the next micro-batch in it): where the batches of a resumed run start."""
        return self.epoch, self.next_batch

    def stream(self, epochs: Callable[[int], Sequence[list[Example]]]) -> Iterator[MicroBatch]:
        """`micro_batches(epochs)` from this run's position."""
        return micro_batches(epochs, *self.position)

    def _report(self, validate: bool) -> None:
        metrics: dict[str, Any] = {**self._window.metrics(), "step": self.step, "epoch": self.epoch,
                                   "lr": self.scheduler.get_last_lr()[0]}
        validated = validate and self.validate is not None
        if validated:
            metrics.update(self._score())
            if self.cfg.patience and self._plateau(metrics[SCORE]):
                self.stopped_by = "patience"
        if self.stopped_by is not None:  # the run's last report: why it ended and where (a budget depends on it)
            metrics.update(stopped_by=self.stopped_by, device=device_name(self.device), elapsed=round(self.elapsed, 1),
                           validation_seconds=round(self.validation_seconds, 1), **self.phase_starts, **self.run_facts)
        self.history.append(metrics)
        if self.on_report is not None:
            self.on_report(metrics, self.state_dict() if validated else None)
        self._window.restart()  # validation and checkpoints are not training time

    def _plateau(self, score: float) -> bool:
        """Count a validation towards `patience` (no new best: one more; a new best: back to 0); whether the
        run has reached it, as rank 0 (the only rank with a score) sees it."""
        if math.isfinite(score) and score > self.best_score:
            self.best_score, self.bad_validations = score, 0
        elif math.isfinite(score):
            self.bad_validations += 1
        return all_reduce(float(self.bad_validations >= self.cfg.patience), "max") > 0

    def _score(self) -> dict[str, float]:
        started, was_training = time.perf_counter(), self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                scores = dict(self.validate(self.model))
        finally:
            self.model.train(was_training)
        self.validated_step = self.step
        score = float(scores[SCORE])
        if self.best is not None and math.isfinite(score):
            snapshot = {name: tensor.detach().to("cpu", copy=True) for name, tensor in self.model.state_dict().items()}
            self.best = select_best(self.best + [(score, self.step, snapshot)], self.cfg.average_best)
        self.validation_seconds += time.perf_counter() - started
        return scores

    def average(self) -> list[dict[str, float]]:
        """Load into the model the mean of the best `average_best` validated states (keep_best), after
        validating the last update if no validation saw it; returns [{step, valid_bleu}], best first."""
        if self.best is None:
            raise ValueError("Harness.average needs keep_best=True")
        if self.validate is not None and self.step > 0 and self.validated_step != self.step:
            self._report(validate=True)
        if not self.best:
            raise ValueError("Harness.average: no validated state (no update, or no validate)")
        self.model.load_state_dict(average_state_dicts([state for _, _, state in self.best]))
        return [{"step": step, SCORE: score} for score, step, _ in self.best]

    def state_dict(self) -> dict[str, Any]:
        """What a run resumes from (live references: deep-copy it to keep a snapshot)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step, "epoch": self.epoch,
                "next_batch": self.next_batch, "history": self.history, "elapsed": self.elapsed,
                "best_score": self.best_score, "bad_validations": self.bad_validations,
                "phase_starts": dict(self.phase_starts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run of `state` (its history gets a `resumed_from` entry)."""
        self.model.load_state_dict(upgrade_state_dict(state["model"]))  # a checkpoint of an older layout too
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.next_batch = state["step"], state["epoch"], state["next_batch"]
        # a checkpoint from before time budgets and patience: its time and plateau count start afresh
        self.elapsed = float(state.get("elapsed", 0.0))
        self.best_score, self.bad_validations = float(state.get("best_score", -math.inf)), int(state.get("bad_validations", 0))
        self.resumed_from = self.step
        self.history = [*state["history"], {"step": self.step, "resumed_from": self.step}]
        started = state.get("phase_starts", {}).get("nmla_start_step")
        if started is not None and getattr(getattr(self._owner, "config", None), "nmla_start_fraction", None) is not None:
            self._start_nmla(started)  # where the run started it, not where it resumed
