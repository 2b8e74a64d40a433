"""REDER's update reads nothing back from the device (counted on CPU by patching every Python-level sync
point), equals the algorithm from before (kept here as the reference), and fit's prefetch thread keeps the run
deterministic and ends with it."""
import collections
import contextlib
import gc
import itertools
import random
import sys
import threading
from pathlib import Path

import pytest
import torch

import reder.objectives.duplex
import reder.objectives.outputs
from pipeline.config import TrainConfig
from pipeline.training import harness
from pipeline.training.harness import Harness
from reder import EOS_ID, DuplexLoss, LossConfig
from reder.config import PAD_ID
from reder.ctc import pad_batch, valid_mask
from reder.layers import ActNorm
from tests.reder.helpers import tiny_model

ROOT = Path(__file__).resolve().parents[2]
OWN = tuple(str(ROOT / package) + "/" for package in ("reder", "pipeline"))  # the project's code, not torch's
CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select", "cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: a second intra-op thread only waits for the first (and on a shared machine, for the others);
    tests/conftest.py restores the session's count after each test."""
    torch.set_num_threads(1)


def _is_mask(index) -> bool:
    indices = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


@contextlib.contextmanager
def counted_syncs():
    """Counts, by (kind, file:line), the calls from reder/ and pipeline/ that sync a CUDA device: a tensor read
    on the host (item, tolist, bool, int, float, …), indexing by a boolean mask (its result's shape is the
    mask's count), torch.nonzero, torch.cuda.synchronize. Calls inside torch are not counted: on CPU they cannot be told from host work."""
    counts: collections.Counter = collections.Counter()

    def record(kind: str) -> None:
        frame = sys._getframe(2)
        if frame.f_code.co_filename.startswith(OWN):
            counts[(kind, f"{Path(frame.f_code.co_filename).relative_to(ROOT)}:{frame.f_lineno}")] += 1

    def wrap(owner, name, kind=None, when=None):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            if when is None or when(*args):
                record(kind or name)
            return original(*args, **kwargs)
        return original, counted

    patches = [(torch.Tensor, name, *wrap(torch.Tensor, name)) for name in CONVERSIONS]
    patches += [(torch.Tensor, name, *wrap(torch.Tensor, name, "mask index", lambda tensor, index, *_: _is_mask(index)))
                for name in ("__getitem__", "__setitem__")]
    patches += [(torch, "nonzero", *wrap(torch, "nonzero")), (torch, "masked_select", *wrap(torch, "masked_select")),
                (torch.cuda, "synchronize", *wrap(torch.cuda, "synchronize"))]
    for owner, name, _, counted in patches:
        setattr(owner, name, counted)
    try:
        yield counts
    finally:
        for owner, name, original, _ in patches:
            setattr(owner, name, original)


def _examples(kd: bool, count: int = 8, seed: int = 0) -> list:
    """Random pairs (KD: with distilled variants) of ids in [4, 10], feasible for CTC at ratio 2."""
    rng = random.Random(seed)
    ids = lambda: [rng.randint(4, 10) for _ in range(rng.randint(2, 5))]  # noqa: E731
    return [(ids(), ids(), ids(), ids()) if kd else (ids(), ids()) for _ in range(count)]


def _train_config(**overrides) -> TrainConfig:
    return TrainConfig(**{"lr": 0.01, "warmup_steps": 4, "max_tokens": 40, "max_steps": 6, "log_every": 3,
                          "validate_every": 100, "bf16": False, "update_freq": 2, **overrides})


LOSSES = {  # glancing on in all; FBA and CC off, FBA alone, both
    "plain": LossConfig(aux_start_step=10**6, glance_start=0.5, glance_end=0.5),
    "fba": LossConfig(aux_start_step=0, lambda_cc=0.0, glance_start=0.5, glance_end=0.5),
    "fba+cc": LossConfig(aux_start_step=0, glance_start=0.5, glance_end=0.5),
}


def _harness(loss: str, dtype: torch.dtype = torch.float32, **overrides) -> Harness:
    torch.manual_seed(0)
    model = tiny_model().to(dtype)
    return Harness(model, DuplexLoss(model, LOSSES[loss]), _train_config(**overrides), "cpu")


def _updates(kd: bool, count: int = 3) -> list[list[list]]:
    examples = _examples(kd, 4 * count)
    return [[examples[4 * k:4 * k + 2], examples[4 * k + 2:4 * k + 4]] for k in range(count)]


@pytest.mark.parametrize("loss, kd", [("plain", True), ("fba", False), ("fba+cc", True)])
def test_an_update_reads_nothing_back_from_the_device(loss, kd):
    """Two updates of two micro-batches each, the first with ActNorm's data-dependent init. What it once read
    back: a float() per loss term, int() per token count, float() of the grad norm, bool() of ActNorm's buffer per
    pass, a mask index in the CTC loss's smoothing, `valid == 0` in FBA. Left: CC's hard decode cuts its
    collapsed frames to the longest (collapse_frames' int(max): the next pass's shape depends on it), one per
    direction and micro-batch."""
    run = _harness(loss)
    with counted_syncs() as counts:
        for batches in _updates(kd, count=2):
            result = run.update(batches)
    expected = {("__int__", "reder/ctc.py"): 2 * 2 * 2} if loss == "fba+cc" else {}
    assert {(kind, where.split(":")[0]): n for (kind, where), n in counts.items()} == expected, dict(counts)
    assert result["total"].device == torch.device("cpu") and isinstance(result["tokens"], int)


def test_a_report_window_reads_its_sums_once():
    """fit's loop, prefetch thread included: one sync per report (the window's sums read at once) and one for
    the returned last loss; the batches are built off the training thread, whose syncs would not count here."""
    run = _harness("plain", max_steps=4, log_every=2, update_freq=1)
    with counted_syncs() as counts:
        run.fit_examples(_examples(kd=False, count=12))
    assert sorted(kind for (kind, _), n in counts.items() for _ in range(n)) == ["__float__", "tolist", "tolist"]
    assert [entry["step"] for entry in run.history] == [2, 4]


# The update as it was when it read back from the device, kept as the reference: the loop with its host reads,
# and the reder pieces that changed (ActNorm's init over x[mask], the smoothing's mask index, FBA's early return).

def _old_pad_batch(sequences):
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tokens = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        tokens[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
    return tokens, lengths


def _old_passes(examples):
    def tensors(pairs):
        src, src_lengths = _old_pad_batch([s + [EOS_ID] for s, _ in pairs])
        tgt, tgt_lengths = _old_pad_batch([t + [EOS_ID] for _, t in pairs])
        return src, src_lengths, tgt, tgt_lengths
    if len(examples[0]) == 2:
        return tensors(examples), None
    return (tensors([(s, kd_t) for s, _, kd_t, _ in examples]), tensors([(kd_s, t) for _, t, _, kd_s in examples]))


def _old_update(run: Harness, batches):
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    sums, tokens = {}, 0
    for examples in batches:
        batch, reverse = _old_passes(examples)
        terms = run.objective(*batch, run.step, tgt2src_batch=reverse)
        (terms["total"] / len(batches)).backward()
        for name, value in terms.items():
            sums[name] = sums.get(name, 0.0) + float(value.detach()) / len(batches)
        tokens += sum(int(b[1].sum() + b[3].sum()) for b in (batch, reverse) if b is not None)
    norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.clip_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.step += 1
    return {**sums, "grad_norm": float(norm), "tokens": tokens}


@torch.no_grad()
def _old_initialize(self, x, mask):
    valid = x[mask].double()
    stats = torch.stack([valid.sum(0), valid.pow(2).sum(0), torch.full_like(valid[0], valid.shape[0])])
    mean = stats[0] / stats[2]
    std = (stats[1] / stats[2] - mean.pow(2)).clamp_min(0).sqrt()
    self.log_scale.copy_(-torch.log(std + 1e-6))
    self.bias.copy_(-mean * torch.exp(self.log_scale.double()))
    self.initialized.fill_(True)
    self._initialized_on_host = True


def _old_smoothed_ctc_loss(log_probs, lengths, targets, target_lengths, blank, smoothing):
    nll = torch.nn.functional.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=blank,
                                       reduction="mean", zero_infinity=True)
    uniform = -log_probs.mean(dim=-1)[valid_mask(lengths, log_probs.shape[1])].mean()
    return (1 - smoothing) * nll + smoothing * uniform


def _old_agreement(forward_states, reverse_states, mask):
    valid = mask.sum()
    if valid == 0:
        return forward_states[0].sum() * 0.0
    total = forward_states[0].new_zeros(())
    for forward, reverse in zip(forward_states, reverse_states):
        total = total + ((1.0 - torch.nn.functional.cosine_similarity(forward, reverse.detach(), dim=-1)) * mask).sum()
    return total / (valid * len(forward_states))


@pytest.mark.parametrize("loss, kd", [("plain", True), ("fba+cc", False)])
def test_an_update_equals_the_one_from_before(loss, kd, monkeypatch):
    """Same seed, same batches, a float64 trunk: every loss term, grad norm and token count of three updates, and
    the parameters and optimizer moments after them, equal the old update's to float32 precision (the
    CTC head's log-probs are float32: its smoothing's masked mean may round differently from the indexed one)."""
    new, old = _harness(loss, torch.float64), _harness(loss, torch.float64)
    torch.manual_seed(1)
    ours = [new.update(batches) for batches in _updates(kd)]
    with monkeypatch.context() as patch:
        patch.setattr(ActNorm, "initialize", _old_initialize)
        patch.setattr(reder.objectives.outputs, "ctc_loss", _old_smoothed_ctc_loss)
        patch.setattr(reder.objectives.duplex, "forward_backward_agreement", _old_agreement)
        torch.manual_seed(1)
        theirs = [_old_update(old, batches) for batches in _updates(kd)]
    for mine, reference in zip(ours, theirs):
        assert mine.keys() == reference.keys()
        assert mine["tokens"] == reference["tokens"]
        for name in reference.keys() - {"tokens"}:
            assert float(mine[name]) == pytest.approx(reference[name], rel=1e-6, abs=1e-9), name
    for a, b in zip(new.model.state_dict().values(), old.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    for a, b in zip(new.optimizer.state.values(), old.optimizer.state.values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-6, atol=1e-15)


def test_pad_batch_equals_the_row_by_row_padding():
    rng = random.Random(0)
    for _ in range(20):
        sequences = [[rng.randint(4, 99) for _ in range(rng.randint(0, 9))] for _ in range(rng.randint(1, 6))]
        if not any(sequences):
            continue
        for end in (None, EOS_ID):
            expected = _old_pad_batch([s + ([end] if end is not None else []) for s in sequences])
            got = pad_batch(sequences, end=end)
            assert got[0].tolist() == expected[0].tolist() and got[1].tolist() == expected[1].tolist()


class Recorder(torch.nn.Module):
    """A linear model that records the first source id of every micro-batch it trains on, in order."""

    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net, self.seen, self.fail_at = torch.nn.Linear(4, 4), [], fail_at

    def forward(self, src, src_lengths, tgt, tgt_lengths, step, tgt2src_batch=None):
        self.seen.append(src[:, 0].tolist())
        if step == self.fail_at:
            raise RuntimeError("failed in training")
        error = torch.nn.functional.mse_loss(self.net(src[:, :4].float() / 10), tgt[:, :4].float() / 10)
        return {"mse": error, "total": error}


def _pairs(count: int = 24) -> list:
    rng = random.Random(5)
    return [([rng.randint(4, 30) for _ in range(3)], [rng.randint(4, 30) for _ in range(3)]) for _ in range(count)]


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "harness-prefetch"]


def test_prefetched_batches_are_trained_in_order_and_the_position_is_the_last_trained(monkeypatch):
    """fit's micro-batches are built on the prefetch thread; the position after fit is that of the last update
    trained, not of the batches the thread built ahead: a run paused at step 4 and resumed trains the
    uninterrupted run's batches, in its order; no thread outlives fit."""
    cfg = TrainConfig(lr=0.01, warmup_steps=20, max_tokens=16, max_steps=9, log_every=1, validate_every=100,
                      bf16=False, update_freq=2)
    whole, builders = Recorder(), []
    passes = harness.passes
    monkeypatch.setattr(harness, "passes", lambda *args, **kwargs: builders.append(threading.current_thread().name)
                        or passes(*args, **kwargs))
    Harness(whole, whole, cfg, "cpu").fit_examples(_pairs())
    assert len(builders) >= 18 and set(builders) == {"harness-prefetch"}
    epochs = lambda e: harness.epoch_batches(_pairs(), cfg.max_tokens, cfg.seed, e, count=cfg.batch_tokens)  # noqa: E731
    expected = [[pair[0][0] for pair in examples] for _, _, examples in itertools.islice(harness.micro_batches(epochs), 18)]
    assert whole.seen == expected
    paused = Recorder()
    first = Harness(paused, paused, cfg, "cpu")
    first.fit_examples(_pairs(), until=4)
    assert first.position == (0, 8) and not _prefetch_threads()  # 12 batches an epoch, 2 an update
    state = first.state_dict()
    resumed = Harness(paused, paused, cfg, "cpu")
    resumed.load_state_dict(state)
    resumed.fit_examples(_pairs())
    assert paused.seen == whole.seen and not _prefetch_threads()


def test_a_failure_in_the_prefetch_thread_is_raised_in_training_after_the_batches_before_it():
    model = Recorder()
    run = Harness(model, model, TrainConfig(max_tokens=16, max_steps=9, bf16=False, validate_every=100), "cpu")

    def failing():
        yield from itertools.islice(harness.micro_batches(lambda e: harness.epoch_batches(_pairs(), 16, 1, e)), 3)
        raise ValueError("broken shard")
    with pytest.raises(ValueError, match="broken shard"):
        run.fit(failing())
    assert run.step == 3 and len(model.seen) == 3
    assert not _prefetch_threads()


def test_a_failure_in_training_stops_the_prefetch_thread():
    model = Recorder(fail_at=2)
    run = Harness(model, model, TrainConfig(max_tokens=16, max_steps=9, bf16=False, validate_every=100), "cpu")
    with pytest.raises(RuntimeError, match="failed in training"):
        run.fit_examples(_pairs())
    assert run.step == 2 and run.position == (0, 3)
    gc.collect()  # the traceback held fit's frame, and with it the prefetching generator
    assert not _prefetch_threads()


@pytest.mark.slow  # inductor compiles the four branch kinds (with and without gradient) on the CPU: ~15 s
def test_compiled_branches_train_as_the_eager_ones():
    """train.compile: without dropout and glancing two updates of a tiny REDER with FBA give the eager run's loss
    terms and parameters to float32 precision (all but the attention's key bias, whose gradient is zero in exact
    arithmetic, a shift common to a query's scores: Adam turns rounding noise into steps of ±lr there).
    Inductor draws its own dropout masks, and a seed from the global generator even at p = 0, which moves
    glancing's draws: hence stagekeys.ADDED_LATER, not NOT_HASHED."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = tiny_model(dropout=0.0, attention_dropout=0.0)
        objective = DuplexLoss(model, LossConfig(aux_start_step=0, lambda_cc=0.0))
        runs.append(Harness(model, objective, _train_config(compile=compiled), "cpu"))
    assert harness.compile_branches(tiny_model()) == 2 * 2 * 2  # per end: layers × (attention, feed-forward)
    for batches in _updates(kd=False, count=2):
        eager, compiled = (run.update(batches) for run in runs)
        for name in eager.keys() - {"tokens"}:
            assert float(compiled[name]) == pytest.approx(float(eager[name]), rel=1e-5), name
    # each branch's two graphs, with and without gradients (harness.compile_branches): not one per layout as well
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2 * 2
    d_model = runs[0].model.cfg.d_model
    for (name, a), b in zip(runs[0].model.named_parameters(), runs[1].model.parameters()):
        if name.endswith("qkv.bias"):
            a, b = torch.cat([a[:d_model], a[2 * d_model:]]), torch.cat([b[:d_model], b[2 * d_model:]])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="has none"):
        harness.compile_branches(torch.nn.Linear(2, 2))


def test_train_compile_is_hashed_only_when_on():
    """Finished train stages keep their directories; a compiled run (other dropout masks) gets its own."""
    from pipeline.stagekeys import train_key
    assert "compile" not in train_key(TrainConfig()) and train_key(TrainConfig(compile=True))["compile"] is True
