"""The training core, without Ray: the pipeline's Ray Train workers (pipeline/raytrain.py) and the GPU
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
import math
import time
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Optional, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.config import TrainConfig
from reder import EOS_ID
from reder.checkpoint import average_state_dicts
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
    it replaced took 9 s (docs/RESULTS.md, "The train stage's start at 100×")."""
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


def _tensors(pairs: list, device: torch.device) -> Batch:
    src, src_lengths = pad_batch([s + [EOS_ID] for s, _ in pairs], device)
    tgt, tgt_lengths = pad_batch([t + [EOS_ID] for _, t in pairs], device)
    return src, src_lengths, tgt, tgt_lengths


def passes(examples: list[Example], device: torch.device | str) -> tuple[Batch, Optional[Batch]]:
    """The tensors of one micro-batch: (src, src_lengths, tgt, tgt_lengths) for both directions, or with KD
    examples src2tgt's (x, teacher(x)) and tgt2src's own (teacher(y), y) batch (DuplexLoss.tgt2src_batch)."""
    if len(examples[0]) == 2:
        return _tensors(examples, device), None
    forward = _tensors([(src, kd_tgt) for src, _, kd_tgt, _ in examples], device)
    return forward, _tensors([(kd_src, tgt) for _, tgt, _, kd_src in examples], device)


def all_reduce(value: float, op: str) -> float:
    """`value` summed ("sum") or minimised ("min") over the DDP ranks; itself outside torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op={"min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}[op])
    return float(tensor.item())


def select_best(scored: list[tuple[float, int, T]], count: int) -> list[tuple[float, int, T]]:
    """The `count` best (score, step, checkpoint) by score, best first; a tie goes to the later step."""
    return sorted(scored, key=lambda entry: (-entry[0], -entry[1]))[:count]


RANK_TOKENS_PER_S = "rank_tokens_per_s"


def clip_gradients(model: torch.nn.Module, clip_norm: float) -> dict[str, torch.Tensor]:
    """Clip the gradients to norm `clip_norm` (0: no clipping); their norms before clipping, as device tensors:
    {"grad_norm": norm}. A model made of separately trained parts (a `clip_groups()` method: name → module, e.g.
    the two teachers of `raytrain.ModelPair`) has each part clipped on its own, as separate runs would clip it,
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
    from the updates before, REDER.loss) is its mean while on, not diluted by the updates without it."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.tokens, self.started = 0, time.perf_counter()

    def add(self, update: dict[str, float]) -> None:
        for name, value in update.items():
            if name != "tokens":
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
        self.tokens += int(update["tokens"])

    def metrics(self) -> dict[str, float]:
        seconds = time.perf_counter() - self.started
        means = {name if name.startswith("grad_norm") else f"train_{name}": value / self.counts[name]
                 for name, value in self.sums.items()}
        return {**means, "tokens_per_s": all_reduce(self.tokens, "sum") / max(seconds, 1e-9),
                RANK_TOKENS_PER_S: self.tokens / max(seconds, 1e-9)}  # this rank's own: a slow host shows


class Harness:
    """The training loop of one model (see the module doc). `validate(model)` returns scores with
    `valid_bleu` (it runs in eval mode without gradients); `on_step(step)` runs after every update."""

    def __init__(self, model: torch.nn.Module, objective: torch.nn.Module, cfg: TrainConfig,
                 device: torch.device | str, validate: Optional[Validate] = None, on_report: Optional[Report] = None,
                 on_step: Optional[Callable[[int], None]] = None, keep_best: bool = False) -> None:
        self.model, self.objective, self.cfg, self.device = model, objective, cfg, torch.device(device)
        self.validate, self.on_report, self.on_step = validate, on_report, on_step
        self.bf16 = cfg.bf16 and self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                           eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: inverse_sqrt(step, cfg.lr, cfg.warmup_steps, cfg.warmup_init_lr) / cfg.lr)
        self.step = self.epoch = self.next_batch = 0
        self.history: list[dict[str, Any]] = []
        self.resumed_from: Optional[int] = None
        self.best: Optional[list[tuple[float, int, dict[str, torch.Tensor]]]] = [] if keep_best else None
        self.validated_step, self.validation_seconds = -1, 0.0
        self._window = _Window()

    def update(self, batches: list[list[Example]]) -> dict[str, float]:
        """One optimizer update over micro-batches (their gradients accumulated, each loss divided by their
        count): the mean of each loss term, the gradient norm before clipping and the tokens seen."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        tokens = 0
        for number, examples in enumerate(batches):
            batch, reverse = passes(examples, self.device)
            # DDP all-reduces gradients in backward: only the last micro-batch's needs to.
            accumulate = number < len(batches) - 1 and hasattr(self.objective, "no_sync")
            with self.objective.no_sync() if accumulate else contextlib.nullcontext():
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    terms = self.objective(*batch, self.step, tgt2src_batch=reverse)
                (terms["total"] / len(batches)).backward()
            for name, value in terms.items():
                sums[name] = sums.get(name, 0.0) + float(value.detach()) / len(batches)
            tokens += sum(int(b[1].sum() + b[3].sum()) for b in self._read(batch, reverse))
        norms = clip_gradients(self.model, self.cfg.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {**sums, **{name: float(norm) for name, norm in norms.items()}, "tokens": tokens}

    def _read(self, batch: Batch, reverse: Optional[Batch]) -> tuple[Batch, ...]:
        """The batches of a micro-batch the objective trains on: both, or the one a one-direction objective's
        `reads` names (a CMLM with KD reads only its direction's pairs)."""
        reads = getattr(getattr(self.objective, "module", self.objective), "reads", None)  # DDP wraps it
        return (reads(batch, reverse),) if reads else tuple(b for b in (batch, reverse) if b is not None)

    def fit(self, batches: Iterator[MicroBatch], until: Optional[int] = None,
            time_cap_s: float = math.inf) -> dict[str, float]:
        """Train from `batches` (which must start at `position`) to step `until` (a pause: no validation
        there) or `max_steps`, or until `time_cap_s` seconds have passed (at least one update; one process
        only: DDP ranks would stop at different steps); a run that ends is validated at its last step.
        Returns this call's updates, seconds and last loss; the model is left in eval mode."""
        stop = self.cfg.max_steps if until is None else min(until, self.cfg.max_steps)
        started, first, last_loss = time.perf_counter(), self.step, math.nan
        self._window.restart()
        capped = False
        while self.step < stop and not capped:
            pulled = [next(batches) for _ in range(self.cfg.update_freq)]
            self.epoch, self.next_batch = pulled[-1][0], pulled[-1][1] + 1
            result = self.update([examples for _, _, examples in pulled])
            last_loss = result["total"]
            self._window.add(result)
            capped = time.perf_counter() - started >= time_cap_s
            validate = self.step % self.cfg.validate_every == 0 or self.step == self.cfg.max_steps or capped
            if validate or self.step % self.cfg.log_every == 0:
                self._report(validate)
            if self.on_step is not None:
                self.on_step(self.step)
        self.model.eval()
        return {"steps": self.step - first, "seconds": round(time.perf_counter() - started, 1),
                "last_loss": round(last_loss, 4)}

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
        self.history.append(metrics)
        if self.on_report is not None:
            self.on_report(metrics, self.state_dict() if validated else None)
        self._window.restart()  # validation and checkpoints are not training time

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
                "next_batch": self.next_batch, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run of `state` (its history gets a `resumed_from` entry)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.next_batch = state["step"], state["epoch"], state["next_batch"]
        self.resumed_from = self.step
        self.history = [*state["history"], {"step": self.step, "resumed_from": self.step}]
