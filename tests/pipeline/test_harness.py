"""pipeline.training.harness: resume and forks through the state, best-k averaging, accumulation, the schedule, the
batching, the tokens an objective trains on; checked against an uninterrupted run, recorded states, one big batch and fairseq's formula."""
import contextlib
import copy
import dataclasses
import math
import random
import time

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.training import harness
from pipeline.training.harness import Harness
from reder import DuplexLoss, LossConfig
from reder.objectives.directional import CmlmObjective
from tests.reder.helpers import tiny_model


class Regression(torch.nn.Module):
    """A model with DuplexLoss's call signature: a linear map from source ids to target ids (as floats)."""

    def __init__(self, width: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, width))

    def forward(self, src, src_lengths, tgt, tgt_lengths, step, tgt2src_batch=None):
        error = torch.nn.functional.mse_loss(self.net(src.float() / 10), tgt.float() / 10)
        return {"mse": error, "total": error}


def _examples(count: int = 12, width: int = 4, seed: int = 0) -> list:
    """Pairs of width-1 ids (width with EOS): every micro-batch pads to the same width."""
    rng = random.Random(seed)
    return [([rng.randint(4, 30) for _ in range(width - 1)], [rng.randint(4, 30) for _ in range(width - 1)])
            for _ in range(count)]


# 12 examples of 4 + 4 tokens, 16 tokens per batch: 2 pairs per batch, 6 batches per epoch
def _config(**overrides) -> TrainConfig:  # warm-up longer than the runs: every update has its own lr
    return TrainConfig(**{"lr": 0.01, "warmup_steps": 20, "max_tokens": 16, "max_steps": 9, "log_every": 1,
                          "validate_every": 100, "bf16": False, **overrides})


def _run(cfg: TrainConfig, seed: int = 0, **kwargs) -> tuple[Harness, torch.nn.Module]:
    torch.manual_seed(seed)
    model = Regression()
    return Harness(model, model, cfg, "cpu", **kwargs), model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(x, y, rtol=0, atol=1e-7) for x, y in zip(a.parameters(), b.parameters()))


def test_a_resumed_run_equals_the_uninterrupted_one():
    """Updates of 2 micro-batches over epochs of 6: the pause at update 4 falls mid-epoch, the run crosses
    epochs; the resumed run starts from the state's position, with its optimizer moments and schedule."""
    examples, cfg = _examples(), _config(update_freq=2)
    whole, whole_model = _run(cfg)
    assert whole.fit_examples(examples)["steps"] == 9
    first, _ = _run(cfg)
    assert first.fit_examples(examples, until=4)["steps"] == 4 and first.position == (1, 2)
    state = copy.deepcopy(first.state_dict())
    resumed, resumed_model = _run(cfg, seed=5)  # other initial weights: the state replaces them
    resumed.load_state_dict(state)
    assert resumed.fit_examples(examples)["steps"] == 5 and resumed.step == 9
    for a, b in zip(whole_model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert resumed.history[4] == {"step": 4, "resumed_from": 4} and resumed.resumed_from == 4
    assert [h["train_total"] for h in resumed.history if "train_total" in h] == \
        pytest.approx([h["train_total"] for h in whole.history])


def test_restarting_without_the_state_is_a_different_run():
    """The check above can fail: without the optimizer's moments, the schedule and the position, the same
    9 updates differ."""
    examples, cfg = _examples(), _config(update_freq=2)
    _, whole = _run(cfg)
    Harness(whole, whole, cfg, "cpu").fit_examples(examples)
    first, restarted = _run(cfg)
    first.fit_examples(examples, until=4)
    Harness(restarted, restarted, _config(update_freq=2, max_steps=5), "cpu").fit_examples(examples)
    assert not _same(whole, restarted)


def test_a_copied_state_forks_two_identical_continuations():
    examples, cfg = _examples(), _config()
    run, _ = _run(cfg)
    run.fit_examples(examples, until=3)
    snapshot = copy.deepcopy(run.state_dict())
    continuations = []
    for data_seed in (0, 1, 0):  # the second one sees other data: it must differ
        fork, model = _run(cfg, seed=7)
        fork.load_state_dict(copy.deepcopy(snapshot))
        fork.fit_examples(_examples(seed=data_seed))
        continuations.append(model)
    assert _same(continuations[0], continuations[2]) and not _same(continuations[0], continuations[1])


def test_best_checkpoints_are_kept_and_averaged():
    """Scores 3, 5, 1, 5 at updates 2, 4, 6, 8, and 4 at update 9, the last (validated because the run ends
    there) with average_best 2: updates 8 and 4 (a tie goes to the later one); their element-wise mean
    is checked against the states the report hook received."""
    scores, states = iter([3.0, 5.0, 1.0, 5.0, 4.0]), {}

    def validate(model):
        assert not model.training and not torch.is_grad_enabled()
        return {"valid_bleu": next(scores)}

    def on_report(metrics, checkpoint):
        assert (checkpoint is not None) == ("valid_bleu" in metrics)
        if checkpoint is not None:
            states[metrics["step"]] = copy.deepcopy(checkpoint["model"])
    run, model = _run(_config(validate_every=2, average_best=2), validate=validate, on_report=on_report, keep_best=True)
    run.fit_examples(_examples())
    assert sorted(states) == [2, 4, 6, 8, 9]
    assert run.average() == [{"step": 8, "valid_bleu": 5.0}, {"step": 4, "valid_bleu": 5.0}]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, (states[8][name] + states[4][name]) / 2)
    assert not torch.allclose(states[8]["net.0.weight"], states[4]["net.0.weight"])  # the mean is not either state


def test_the_last_update_is_scored_before_averaging_when_it_falls_between_validations():
    """A paused run (update 5, validations every 2) is validated by `average`; a time cap ends a run between
    validations and `fit` validates its last step."""
    scores = iter([1.0, 2.0, 9.0])
    run, _ = _run(_config(validate_every=2, average_best=2), validate=lambda m: {"valid_bleu": next(scores)},
                  keep_best=True)
    run.fit_examples(_examples(), until=5)
    assert run.validated_step == 4
    assert run.average() == [{"step": 5, "valid_bleu": 9.0}, {"step": 4, "valid_bleu": 2.0}]
    assert run.history[-1]["step"] == 5 and run.history[-1]["valid_bleu"] == 9.0

    class Slow(Regression):
        def forward(self, *args, **kwargs):
            time.sleep(0.02)
            return super().forward(*args, **kwargs)
    torch.manual_seed(0)
    model = Slow()
    capped = Harness(model, model, _config(max_steps=1000, validate_every=500, average_best=1), "cpu",
                     validate=lambda m: {"valid_bleu": 1.0}, keep_best=True)
    done = capped.fit_examples(_examples(), time_cap_s=0.1)
    assert 1 <= done["steps"] < 500 and capped.validated_step == capped.step
    assert capped.average() == [{"step": capped.step, "valid_bleu": 1.0}]
    with pytest.raises(ValueError, match="no validated state"):
        _run(_config(average_best=1), validate=lambda m: {"valid_bleu": 1.0}, keep_best=True)[0].average()


class SwitchedOn(Regression):
    """Regression plus an auxiliary term that exists only from step `start` on (as REDER's FBA and CC: absent
    before their start step), of value 2 + step, so its mean over a window is known exactly."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start

    def forward(self, src, src_lengths, tgt, tgt_lengths, step, tgt2src_batch=None):
        terms = super().forward(src, src_lengths, tgt, tgt_lengths, step)
        if step >= self.start:
            terms["aux"] = torch.tensor(2.0 + step)
        return terms


def test_a_term_that_switches_on_inside_a_window_is_averaged_over_the_updates_that_computed_it():
    """The window of steps 1-5 has the term from its 4th update (steps 3 and 4 of the objective,
    values 5 and 6): its mean is 5.5, not (5 + 6) / 5 = 2.2, which read as "the auxiliary losses grow" once
    the next window showed their full value. Terms every update has are averaged over all of them."""
    torch.manual_seed(0)
    model = SwitchedOn(start=3)
    reports = []
    run = Harness(model, model, _config(max_steps=10, log_every=5), "cpu", on_report=lambda m, _: reports.append(m))
    run.fit_examples(_examples())
    assert [r["step"] for r in reports] == [5, 10]
    assert reports[0]["train_aux"] == pytest.approx(5.5)
    assert reports[1]["train_aux"] == pytest.approx(sum(2.0 + step for step in range(5, 10)) / 5)
    assert reports[0]["train_total"] == pytest.approx(reports[0]["train_mse"])  # every update: the plain mean


def test_validating_leaves_the_run_unchanged():
    plain, plain_model = _run(_config())
    plain.fit_examples(_examples())
    scored, scored_model = _run(_config(validate_every=1, average_best=5), validate=lambda m: {"valid_bleu": 1.0},
                                keep_best=True)
    scored.fit_examples(_examples())
    for a, b in zip(plain_model.parameters(), scored_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not scored_model.training  # fit leaves a trained model ready to decode


class Linear(torch.nn.Module):
    """A linear model with a mean squared error: its gradient over a batch is the mean of its pairs'."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Linear(4, 4)
        self.syncs = []

    def forward(self, src, src_lengths, tgt, tgt_lengths, step, tgt2src_batch=None):
        error = torch.nn.functional.mse_loss(self.net(src.float() / 10), tgt.float() / 10)
        return {"mse": error, "total": error}

    def no_sync(self):  # as DDP's: gradients are not all-reduced inside
        self.syncs.append(len(self.syncs))
        return contextlib.nullcontext()


def test_two_accumulated_micro_batches_equal_one_batch_of_both():
    examples = _examples(count=4)
    first, second = examples[:2], examples[2:]
    accumulated, whole = Linear(), Linear()
    cfg = _config(clip_norm=0.5)
    two = Harness(accumulated, accumulated, dataclasses.replace(cfg, update_freq=2), "cpu")
    one = Harness(whole, whole, cfg, "cpu")
    for _ in range(3):
        split, joint = two.update([first, second]), one.update([first + second])
        assert split["total"] == pytest.approx(joint["total"]) and split["grad_norm"] == pytest.approx(joint["grad_norm"])
        assert split["tokens"] == joint["tokens"] == 4 * 8
    for a, b in zip(accumulated.parameters(), whole.parameters()):
        torch.testing.assert_close(a, b)
    assert accumulated.syncs == [0, 1, 2] and whole.syncs == []  # no_sync on every micro-batch but the last


def test_the_schedule_is_fairseq_inverse_sqrt():
    """The learning rate of update k + 1 (after k updates), against fairseq's inverse_sqrt: warmup_init_lr +
    k·(lr - warmup_init_lr)/warmup during warm-up, then lr·√warmup/√k; AdamW's hyper-parameters from the config."""
    lr, warmup, init = 1e-3, 4, 1e-7
    cfg = _config(lr=lr, warmup_steps=warmup, warmup_init_lr=init, adam_betas=(0.8, 0.9), adam_eps=1e-6,
                  weight_decay=0.1, max_steps=12)
    run, _ = _run(cfg)
    group = run.optimizer.param_groups[0]
    assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-6 and group["weight_decay"] == 0.1
    batches = harness.micro_batches(lambda e: harness.epoch_batches(_examples(), cfg.max_tokens, 1, e))
    for k in range(1, 12):
        run.update([next(batches)[2]])
        expected = init + k * (lr - init) / warmup if k < warmup else lr * math.sqrt(warmup) / math.sqrt(k)
        assert group["lr"] == pytest.approx(expected, rel=1e-12)
    reported, _ = _run(cfg)
    reported.fit_examples(_examples())
    assert [h["lr"] for h in reported.history] == pytest.approx([lr * math.sqrt(warmup / k) if k >= warmup else
                                                                 init + k * (lr - init) / warmup for k in range(1, 13)])


def test_inverse_sqrt_warms_up_linearly_then_decays_as_fairseq():
    lr, warmup, init = 1e-3, 100, 1e-7
    assert harness.inverse_sqrt(0, lr, warmup, init) == pytest.approx(init + (lr - init) / warmup)  # step 0 acts as 1
    assert harness.inverse_sqrt(50, lr, warmup, init) == pytest.approx(init + 50 * (lr - init) / warmup)
    assert harness.inverse_sqrt(100, lr, warmup, init) == pytest.approx(lr)
    assert harness.inverse_sqrt(400, lr, warmup, init) == pytest.approx(lr / 2)  # lr * sqrt(100 / 400)
    assert harness.inverse_sqrt(10_000, lr, 0, init) == pytest.approx(lr / 100)  # no warm-up: lr / sqrt(step)
    values = [harness.inverse_sqrt(s, lr, warmup, init) for s in range(1, 300)]
    assert max(values) == pytest.approx(lr) and values.index(max(values)) == warmup - 1


def _token_batches(*args, **kwargs) -> list[list[int]]:
    return [batch.tolist() for batch in harness.token_batches(*args, **kwargs)]


def _list_token_batches(src, tgt, max_tokens, seed, count="sum"):
    """The reference: token_batches as it was written with Python lists (sort by (target, source) length of a
    shuffled order, cut greedily, shuffle the batches), with its two shuffles drawn from numpy's Generator."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(src)).tolist()
    order.sort(key=lambda i: (tgt[i], src[i]))
    batches, current, longest_src, longest_tgt = [], [], 0, 0
    for index in order:
        s, t = src[index] + 1, tgt[index] + 1
        if current and harness.batch_size_tokens(len(current) + 1, max(longest_src, s), max(longest_tgt, t),
                                                 count) > max_tokens:
            batches.append(current)
            current, longest_src, longest_tgt = [], 0, 0
        current.append(index)
        longest_src, longest_tgt = max(longest_src, s), max(longest_tgt, t)
    if current:
        batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]


@pytest.mark.parametrize("count", ["sum", "max"])
@pytest.mark.parametrize("max_tokens", [7, 64, 400, 5000])
def test_token_batches_are_the_list_based_cut_of_the_same_shuffle(count, max_tokens):
    """The vectorised batching against the list-based one it replaced, on the same random draws: the same
    batches in the same order, with many ties, pairs longer than the budget alone and a budget above them all."""
    rng = random.Random(max_tokens)
    src = [rng.randint(0, 40) for _ in range(3000)]
    tgt = [rng.randint(0, 12) for _ in range(3000)]
    src[11], tgt[12], src[13], tgt[13] = 900, 700, 500, 500
    assert _token_batches(src, tgt, max_tokens, 9, count) == _list_token_batches(src, tgt, max_tokens, 9, count)
    assert harness.token_batches([], [], max_tokens, 9, count) == []
    assert _token_batches([3], [4], max_tokens, 9, count) == [[0]]


def test_an_example_table_batches_as_the_same_examples_in_lists_do():
    """ExampleTable (Arrow columns as flat token arrays) against Python lists: the same rows, bucketing lengths
    and epoch batches, plain and with KD (bucketed by the longer variant of each side); a slice cuts the epoch."""
    rng = random.Random(2)
    tokens = lambda: [rng.randint(4, 99) for _ in range(rng.randint(0, 9))]  # noqa: E731
    plain = [(tokens(), tokens()) for _ in range(300)]
    kd = [(s, t, tokens(), tokens()) for s, t in plain]
    for examples in (plain, kd):
        names = harness.EXAMPLE_COLUMNS[:len(examples[0])]
        columns = {name: pa.array([e[i] for e in examples], pa.list_(pa.int32())) for i, name in enumerate(names)}
        table = harness.ExampleTable(pa.table({"id": list(range(300)), **columns}).slice(0))
        assert len(table) == 300 and table.rows([5, 0, 299]) == [examples[5], examples[0], examples[299]]
        for mine, theirs in zip(harness.bucket_lengths(table), harness.bucket_lengths(examples)):
            assert mine.tolist() == theirs.tolist()
        batches = harness.epoch_batches(table, 60, 1, 3, rank=1)
        assert list(batches) == list(harness.epoch_batches(examples, 60, 1, 3, rank=1))
        assert sorted(e for b in batches for e in b) == sorted(examples)
        assert list(batches[:4]) == list(batches)[:4] and len(batches[:4]) == 4
    chunked = pa.table({"src_ids": pa.chunked_array([columns["src_ids"][:100], columns["src_ids"][100:]]),
                        "tgt_ids": columns["tgt_ids"]})
    assert harness.ExampleTable(chunked).rows(range(300)) == plain
    assert harness.ExampleTable(chunked.slice(130, 50)).rows(range(50)) == plain[130:180]  # a slice's offsets
    with pytest.raises(ValueError, match="src_ids, tgt_ids"):
        harness.ExampleTable(pa.table({"src_ids": columns["src_ids"], "tgt_ids": columns["tgt_ids"],
                                       "kd_tgt_ids": columns["kd_tgt_ids"]}))


def test_token_batches_cover_every_pair_once_within_the_budget():
    rng = random.Random(3)
    src = [rng.randint(1, 60) for _ in range(500)]
    tgt = [rng.randint(1, 60) for _ in range(500)]
    src[7], tgt[7] = 300, 280  # longer than the budget on its own: a batch of one
    batches = _token_batches(src, tgt, max_tokens=400, seed=5)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        cost = len(batch) * (max(src[i] + 1 for i in batch) + max(tgt[i] + 1 for i in batch))
        assert cost <= 400 or len(batch) == 1
    assert [7] in batches
    assert _token_batches(src, tgt, 400, seed=5) == batches  # deterministic
    assert _token_batches(src, tgt, 400, seed=6) != batches  # the seed reshuffles
    sizes = sorted(len(b) for b in batches)
    assert sizes[-1] >= 3 and sum(sizes) / len(sizes) > 2  # buckets fill up: not one pair per batch


@pytest.mark.parametrize("count", ["sum", "max"])
def test_both_token_counts_cover_every_pair_once_within_the_budget(count):
    """train.batch_tokens: "sum" counts sentences × (longest source + longest target), "max" (fairseq's)
    sentences × max(longest source, longest target); each batch fits its count, every pair comes once."""
    rng = random.Random(4)
    src = [rng.randint(1, 60) for _ in range(500)]
    tgt = [rng.randint(1, 60) for _ in range(500)]
    src[9] = 420  # longer than the budget on its own: a batch of one
    batches = _token_batches(src, tgt, max_tokens=400, seed=5, count=count)
    assert sorted(i for b in batches for i in b) == list(range(500))
    combine = (lambda a, b: a + b) if count == "sum" else max
    for batch in batches:
        cost = len(batch) * combine(max(src[i] + 1 for i in batch), max(tgt[i] + 1 for i in batch))
        assert cost <= 400 or len(batch) == 1
    assert [9] in batches
    if count == "sum":
        assert batches == _token_batches(src, tgt, 400, seed=5)  # the default: the convention until now
    else:  # about twice the sentences per batch at the same budget
        assert len(batches) < 0.7 * len(_token_batches(src, tgt, 400, seed=5))
    with pytest.raises(ValueError, match="count must be 'sum' or 'max', got 'min'"):
        harness.token_batches(src, tgt, 400, seed=5, count="min")


def test_fit_examples_counts_tokens_as_the_config_says():
    examples = [([4] * 3, [5] * 3) for _ in range(12)]  # 4 + 4 tokens with EOS
    for count, per_batch in (("sum", 2), ("max", 4)):  # 16 // 8 and 16 // 4
        run, _ = _run(_config(batch_tokens=count, max_steps=1))
        seen = []
        prepare = run._prepare  # fit's prefetch thread builds each micro-batch through it
        run._prepare = lambda batch: seen.append(batch) or prepare(batch)
        run.fit_examples(examples)
        assert len(seen[0]) == per_batch


def test_epochs_reshuffle_and_a_stream_starts_where_a_run_stopped():
    examples = _examples()
    epochs = lambda e: harness.epoch_batches(examples, 16, 1, e)  # noqa: E731
    assert list(epochs(0)) != list(epochs(1)) and sorted(e for b in epochs(0) for e in b) == sorted(examples)
    kd = [(s, t, t + [5, 5], s[:1]) for s, t in examples]  # bucketed by the longer variant of each side
    assert all(len(batch) == 1 for batch in harness.epoch_batches(kd, 16, 1, 0))
    stream = harness.micro_batches(epochs)
    seen = [next(stream) for _ in range(8)]
    assert [(e, i) for e, i, _ in seen] == [(0, i) for i in range(6)] + [(1, 0), (1, 1)]
    later = harness.micro_batches(epochs, 1, 1)
    assert next(later) == seen[-1]
    with pytest.raises(RuntimeError, match="no batch"):
        next(harness.micro_batches(lambda e: []))


def test_kd_examples_train_each_direction_on_its_own_distilled_pairs():
    """A KD micro-batch: src2tgt on (x, teacher(x)), tgt2src on (teacher(y), y); DuplexLoss runs both in one
    forward and its terms equal two separate one-direction losses."""
    examples = [([4, 5, 6], [7, 8], [9], [10, 4, 5, 6]), ([5], [6, 7, 8], [4, 4, 9], [5, 5])]  # src, tgt, kd_tgt, kd_src
    forward, backward = harness.passes(examples, torch.device("cpu"))
    assert forward[0].tolist() == [[4, 5, 6, 3], [5, 3, 0, 0]] and forward[2].tolist() == [[9, 3, 0, 0], [4, 4, 9, 3]]
    assert backward[0].tolist() == [[10, 4, 5, 6, 3], [5, 5, 3, 0, 0]] and backward[2].tolist() == [[7, 8, 3, 0], [6, 7, 8, 3]]
    reference, none = harness.passes([e[:2] for e in examples], torch.device("cpu"))
    assert none is None and reference[2].tolist() == [[7, 8, 3, 0], [6, 7, 8, 3]]

    model = tiny_model(dropout=0.0, attention_dropout=0.0).double()
    objective = DuplexLoss(model, LossConfig(aux_start_step=0))
    model.initialize(*forward)  # ActNorm from one batch, so both evaluations below see the same model
    joint = objective(*forward, 1, tgt2src_batch=backward)
    alone = {**objective(*forward, 1, ("src2tgt",)), **objective(*backward, 1, ("tgt2src",))}
    for name in ("ctc_src2tgt", "fba_src2tgt", "cc_src2tgt", "ctc_tgt2src", "fba_tgt2src", "cc_tgt2src"):
        torch.testing.assert_close(joint[name], alone[name])
    assert joint["fba_tgt2src"] > 0 and joint["cc_src2tgt"] > 0
    lam = objective.config
    expected = sum(alone[f"ctc_{d}"] + lam.lambda_fba * alone[f"fba_{d}"] + lam.lambda_cc * alone[f"cc_{d}"]
                   for d in ("src2tgt", "tgt2src"))
    torch.testing.assert_close(joint["total"], expected)


class Clock:
    """A stand-in for the harness's clock: `perf_counter` reads `now`, which the test moves (by `tick` seconds
    after every update, from `on_step`), so that runs budgeted by time are deterministic."""

    def __init__(self, tick: float = 1.0) -> None:
        self.now, self.tick = 100.0, tick

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:  # the wall clock the harness stamps its first and last update with
        return 1.8e9 + self.now

    def on_step(self, step: int) -> None:
        self.now += self.tick


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(harness, "time", clock)
    return clock


def test_max_time_stops_the_run_validates_its_last_update_and_says_why(clock):
    """1 s per update, max_time 5 s: the clock reads 5 s after update 6, which stops the run (max_steps 1000
    is far); that update is validated, the last report names the stop, the card and the seconds."""
    scores = iter(range(100))
    run, _ = _run(_config(max_steps=1000, max_time=5.0, validate_every=4, log_every=2),
                  validate=lambda m: {"valid_bleu": float(next(scores))}, on_step=clock.on_step)
    done = run.fit_examples(_examples())
    assert done["steps"] == 6 and done["stopped_by"] == "max_time" == run.stopped_by
    assert [h["step"] for h in run.history if "valid_bleu" in h] == [4, 6]
    assert run.history[-1]["stopped_by"] == "max_time" and run.history[-1]["device"].startswith("cpu")
    assert run.elapsed == pytest.approx(6.0)  # the last update's second, counted at the end of the fit
    # the wall clock of its first and last update and the validations' seconds: the stage's timeline (raytrain)
    last = run.history[-1]
    assert (last["first_update_at"], last["last_update_at"], last["validation_seconds"]) == (1.8e9 + 100, 1.8e9 + 105, 0.0)
    ended, _ = _run(_config(max_steps=3), on_step=clock.on_step)
    assert ended.fit_examples(_examples())["stopped_by"] == "max_steps"


def test_a_resumed_time_budget_honours_what_is_left(clock):
    """Paused at update 3 and resumed from a copy of its state, a run budgeted by time stops where the
    uninterrupted one does, with the same parameters (its schedule follows the time spent: the same too)."""
    cfg = _config(max_steps=1000, max_time=8.0, lr_scheduler="linear", warmup_fraction=0.25)
    whole, whole_model = _run(cfg, on_step=clock.on_step)
    assert whole.fit_examples(_examples())["steps"] == 9
    first, _ = _run(cfg, on_step=clock.on_step)
    first.fit_examples(_examples(), until=3)
    clock.now += 1000.0  # the time between the pause and the resume is not the run's
    resumed, resumed_model = _run(cfg, seed=5, on_step=clock.on_step)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.fit_examples(_examples())["steps"] == 6 and resumed.step == 9 and resumed.stopped_by == "max_time"
    for a, b in zip(whole_model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert [h["lr"] for h in resumed.history if "lr" in h] == pytest.approx([h["lr"] for h in whole.history])


def test_without_max_time_a_time_cap_sizes_the_schedule_as_an_equal_max_time_would(clock):
    """The last training stage of a budgeted pipeline run has no max_time and its share of the budget as its time
    cap: its warm-up and decay follow the cap as they follow an equal max_time (the same learning rate at every
    update, the same last update), also when paused and resumed with what the budget then leaves; without a cap
    the schedule follows the steps alone."""
    cfg = dict(max_steps=1000, lr_scheduler="linear", warmup_fraction=0.25)
    lrs = lambda run: [h["lr"] for h in run.history if "lr" in h]  # noqa: E731
    timed, _ = _run(_config(max_time=8.0, **cfg), on_step=clock.on_step)
    timed.fit_examples(_examples())
    capped, _ = _run(_config(**cfg), on_step=clock.on_step)
    capped.fit_examples(_examples(), time_cap_s=8.0)
    assert (capped.stopped_by, capped.step, timed.stopped_by, timed.step) == ("time_cap", 9, "max_time", 9)
    assert lrs(capped) == pytest.approx(lrs(timed)) and max(lrs(capped)) > 0.5 * capped.cfg.lr
    first, _ = _run(_config(**cfg), on_step=clock.on_step)
    first.fit_examples(_examples(), until=3, time_cap_s=8.0)
    resumed, _ = _run(_config(**cfg), seed=5, on_step=clock.on_step)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    resumed.fit_examples(_examples(), time_cap_s=8.0 - resumed.elapsed)
    assert resumed.step == 9 and lrs(resumed) == pytest.approx(lrs(timed))
    by_steps, _ = _run(_config(**cfg), on_step=clock.on_step)
    by_steps.fit_examples(_examples(), until=9)
    assert by_steps.horizon == 0 and max(lrs(by_steps)) < 0.05 * by_steps.cfg.lr  # warm-up over 250 of 1,000 steps


def test_a_time_cap_of_one_call_stops_it_without_touching_the_run_budget(clock):
    run, _ = _run(_config(max_steps=1000), on_step=clock.on_step)
    assert run.fit_examples(_examples(), time_cap_s=2.5)["steps"] == 4 and run.stopped_by == "time_cap"


def test_patience_stops_after_that_many_validations_without_a_new_best():
    """Scores 1, 3, 2, 3, 2.5 with patience 3: the best (3 at update 4) is not beaten at updates 6, 8, 10
    (a tie is no new best), so the run stops at update 10 — not at max_steps 30; patience 0 never stops it."""
    def scores():
        values = iter([1.0, 3.0, 2.0, 3.0, 2.5, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0])
        return lambda model: {"valid_bleu": next(values)}
    run, _ = _run(_config(max_steps=30, validate_every=2, patience=3), validate=scores())
    done = run.fit_examples(_examples())
    assert done == {**done, "steps": 10, "stopped_by": "patience"}
    assert (run.best_score, run.bad_validations) == (3.0, 3)
    assert run.history[-1]["stopped_by"] == "patience" and run.history[-1]["step"] == 10
    patient, _ = _run(_config(max_steps=30, validate_every=2), validate=scores())
    assert patient.fit_examples(_examples())["stopped_by"] == "max_steps" and patient.step == 30
    # the plateau count travels with the state: a run resumed after update 8 stops at 10 too
    first, _ = _run(_config(max_steps=30, validate_every=2, patience=3), validate=scores())
    first.fit_examples(_examples(), until=8)
    values = iter([2.5])
    resumed, _ = _run(_config(max_steps=30, validate_every=2, patience=3), validate=lambda m: {"valid_bleu": next(values)})
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.fit_examples(_examples())["steps"] == 2 and resumed.stopped_by == "patience"



@pytest.mark.parametrize("ended", ["max_steps", "max_time", "patience"])
def test_a_run_resumed_after_its_end_reports_the_end_again_with_its_restart(ended, clock):
    """A run stopped after its last checkpoint but before its stage published (the fault suite's train stage,
    SIGINT after the final validation) is resumed at its end: no update, but its last update validated again and
    reported with a checkpoint whose history has the restart — the stage's report counts restarts from the latest
    checkpoint's history. Before, such a resume reported nothing and the restart went uncounted."""
    cfg = _config(**{"max_steps": {"max_steps": 6}, "max_time": {"max_steps": 1000, "max_time": 4.0},
                     "patience": {"max_steps": 1000, "patience": 1}}[ended], validate_every=2)
    scores = iter([5.0, 4.0, 3.0, 2.0, 1.0])
    first, _ = _run(cfg, validate=lambda m: {"valid_bleu": next(scores)}, on_step=clock.on_step)
    assert first.fit_examples(_examples())["stopped_by"] == ended
    reports = []
    resumed, model = _run(cfg, seed=5, validate=lambda m: {"valid_bleu": 7.0}, on_step=clock.on_step,
                          on_report=lambda metrics, state: reports.append((metrics, copy.deepcopy(state))))
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    done = resumed.fit_examples(_examples())
    assert done["steps"] == 0 and done["stopped_by"] == ended and resumed.step == first.step
    [(metrics, state)] = reports
    assert metrics["step"] == first.step and metrics["stopped_by"] == ended and metrics["valid_bleu"] == 7.0
    assert "tokens_per_s" not in metrics  # no update in this window: no rate to report
    assert [h for h in state["history"] if "resumed_from" in h] == [{"step": first.step, "resumed_from": first.step}]
    assert _same(model, first.model)


def test_a_step_scored_twice_counts_once_among_the_best():
    """A run resumed at its end scores its last update again (the same weights): averaging must not weigh it twice."""
    assert harness.select_best([(5.0, 20, "a"), (3.0, 10, "b"), (5.0, 20, "c"), (4.0, 15, "d")], 2) == \
        [(5.0, 20, "a"), (4.0, 15, "d")]

@pytest.mark.parametrize("scheduler", ["inverse_sqrt", "linear"])
def test_the_schedule_sized_to_the_run_follows_its_progress(scheduler):
    """warmup_fraction f of the run, progress p = max(step/max_steps, time spent/max_time): a linear warm-up to
    lr at p = f, then fairseq's inverse_sqrt in p (lr·√(f/p)) or its polynomial_decay of power 1 (to 0 at
    p = 1); the textbook formulas written out here."""
    lr, init, f = 1e-3, 1e-7, 0.1
    cfg = TrainConfig(lr=lr, warmup_init_lr=init, max_steps=200, warmup_fraction=f, lr_scheduler=scheduler)

    def expected(p: float) -> float:
        if p < f:
            return init + (lr - init) * p / f
        return lr * math.sqrt(f / p) if scheduler == "inverse_sqrt" else lr * (1 - p) / (1 - f)
    for step in (0, 5, 19, 20, 50, 100, 199, 200):
        assert harness.learning_rate(step, cfg) == pytest.approx(expected(step / 200))
    # by time: half the budget spent at step 10 is progress 0.5
    assert harness.learning_rate(10, cfg, time_progress=0.5) == pytest.approx(expected(0.5))
    assert harness.learning_rate(150, cfg, time_progress=0.5) == pytest.approx(expected(0.75))  # steps lead
    # without a fraction, inverse_sqrt is fairseq's by steps, whatever the time
    plain = TrainConfig(lr=lr, warmup_init_lr=init, warmup_steps=10, max_steps=200)
    assert harness.learning_rate(40, plain, time_progress=0.9) == pytest.approx(harness.inverse_sqrt(40, lr, 10, init))
    linear = TrainConfig(lr=lr, warmup_init_lr=init, warmup_steps=20, max_steps=200, lr_scheduler="linear")
    assert harness.learning_rate(10, linear) == pytest.approx(harness.inverse_sqrt(10, lr, 20, init))
    assert harness.learning_rate(110, linear) == pytest.approx(lr * (1 - 110 / 200) / (1 - 20 / 200))


def test_the_harness_counts_the_tokens_an_objective_trains_on():
    """With KD examples (x, y, teacher(x), teacher(y)) a CMLM direction trains on one of the two batches, and
    its tokens/s counts that batch only; REDER's DuplexLoss reads both."""
    from reder import CMLM, CmlmConfig, ModelConfig, REDER

    example = ([4, 5], [6, 7, 8], [9, 10, 11, 12, 13], [14])  # + EOS: x 3, y 4, teacher(x) 6, teacher(y) 2
    cfg = TrainConfig(lr=1e-3, warmup_steps=2, max_steps=1)
    cmlm = CMLM(CmlmConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1,
                           dropout=0.0, max_positions=32))
    for direction, tokens in (("src2tgt", 3 + 6), ("tgt2src", 2 + 4)):
        harness = Harness(cmlm, CmlmObjective(cmlm, direction), cfg, "cpu")
        assert harness.update([[example, example]])["tokens"] == 2 * tokens, direction
    reder = REDER(ModelConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, dropout=0.0,
                              max_positions=64))
    assert Harness(reder, DuplexLoss(reder, LossConfig()), cfg, "cpu").update([[example, example]])["tokens"] == 2 * (9 + 6)


@pytest.mark.parametrize("budget", ["steps", "time"])
def test_nmla_started_by_a_fraction_of_the_run_is_the_run_started_at_that_step_and_a_resumed_run_keeps_it(budget, clock):
    """loss.nmla_start_fraction 0.5 of a run of 8 updates (max_steps 8; or max_time 8 s at 1 s an update, max_steps
    far: 4 s are spent after update 4, 8 s after update 8, the clock that stops it reads them an update later, so 9
    updates): the objective's NMLA starts at update 4, the 5th update is the first to train it (its term in the
    reports from step 5 on, CTC's before), the last report says where, and the run equals the same run with
    nmla_start_step 4; a run paused at update 6 and resumed from a copy of its state (a fresh objective, the
    fraction again) keeps update 4 and ends with the same parameters."""
    cfg = _config(**({"max_steps": 8} if budget == "steps" else {"max_steps": 1000, "max_time": 8.0}))

    def run(loss: LossConfig, seed: int = 0) -> tuple[Harness, torch.nn.Module, list]:
        torch.manual_seed(seed)
        model = tiny_model(dropout=0.0, attention_dropout=0.0)
        reports = []
        return Harness(model, DuplexLoss(model, loss), cfg, "cpu", on_step=clock.on_step,
                       on_report=lambda m, _: reports.append(m)), model, reports

    by_fraction = LossConfig(lambda_fba=0.0, lambda_cc=0.0, nmla_start_fraction=0.5)
    examples = [([4 + i % 7 for i in src], [4 + i % 7 for i in tgt]) for src, tgt in _examples(width=3)]  # vocabulary 12
    whole, whole_model, reports = run(by_fraction)
    updates = 8 if budget == "steps" else 9
    assert whole.fit_examples(examples)["steps"] == updates
    assert [("train_nmla_src2tgt" in r, "train_ctc_src2tgt" in r) for r in reports if "train_total" in r] == \
        [(False, True)] * 4 + [(True, False)] * (updates - 4)
    assert whole.history[-1]["nmla_start_step"] == 4 and whole.objective.config.nmla_start_step == 4
    by_step, step_model, _ = run(LossConfig(lambda_fba=0.0, lambda_cc=0.0, nmla_start_step=4))
    by_step.fit_examples(examples)
    assert _same(whole_model, step_model)

    first, _, _ = run(by_fraction)
    first.fit_examples(examples, until=6)
    clock.now += 1000.0  # the pause is not the run's time
    resumed, resumed_model, _ = run(by_fraction, seed=5)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.objective.config.nmla_start_step == 4  # where the run started it, not update 6
    assert resumed.fit_examples(examples)["steps"] == updates - 6 and resumed.history[-1]["nmla_start_step"] == 4
    assert _same(whole_model, resumed_model)
    late, late_model, _ = run(by_fraction, seed=5)  # a state from before the start: the fraction decides again
    paused, _, _ = run(by_fraction)
    paused.fit_examples(examples, until=2)
    clock.now += 1000.0
    late.load_state_dict(copy.deepcopy(paused.state_dict()))
    assert late.objective.config.nmla_start_fraction == 0.5 and late.fit_examples(examples)["steps"] == updates - 2
    assert late.history[-1]["nmla_start_step"] == 4 and _same(whole_model, late_model)
