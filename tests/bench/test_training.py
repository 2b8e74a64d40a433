"""bench.training.fit: a run stopped and continued through `state` is the run that never stopped, and a deep
copy of the state forks it (bench.quality's aux phase relies on both); BestCheckpoints averages the best
scored states, as the pipeline's train stage does."""
import copy

import pytest
import torch

from bench import training


def _problem(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    inputs, targets = torch.randn(3, 5, 4), torch.randn(3, 5, 1)
    return model, lambda step, b: torch.nn.functional.mse_loss(model(inputs[b]), targets[b])


def _fit(model, loss, steps, state=None):  # warm-up longer than the run: every update has its own learning rate
    return training.fit(model, loss, 3, steps, lr=0.01, warmup=10, device="cpu", state=state)


def test_a_continued_run_equals_the_uninterrupted_one():
    whole, loss = _problem()
    assert _fit(whole, loss, 6)["steps"] == 6
    split, loss = _problem()
    state = {}
    assert _fit(split, loss, 2, state)["steps"] == 2 and state["step"] == 2
    report = _fit(split, loss, 6, state)
    assert report["steps"] == 4 and state["step"] == 6
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_restarting_without_the_state_is_a_different_run():
    """The check above can fail: without the optimizer's moments and the schedule, the same 6 updates differ."""
    whole, loss = _problem()
    _fit(whole, loss, 6)
    restarted, loss = _problem()
    _fit(restarted, loss, 2)
    _fit(restarted, loss, 4)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole.parameters(), restarted.parameters()))


def test_a_copied_state_forks_two_identical_continuations():
    model, loss = _problem()
    state = {}
    _fit(model, loss, 3, state)
    weights, snapshot = copy.deepcopy(model.state_dict()), copy.deepcopy(state)
    _fit(model, loss, 5, state)
    first = [p.detach().clone() for p in model.parameters()]
    other, loss = _problem(seed=1)
    other.load_state_dict(weights)
    _fit(other, loss, 5, copy.deepcopy(snapshot))  # different data (seed 1), same start: must differ from `first`
    assert not all(torch.allclose(a, b) for a, b in zip(first, other.parameters()))
    again, loss = _problem()
    again.load_state_dict(weights)
    _fit(again, loss, 5, snapshot)
    for a, b in zip(first, again.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_best_checkpoints_average_the_best_scored_states():
    """Scores 3, 5, 1, 5 at updates 2, 4, 6, 8 with keep 2: updates 8 and 4 (a tie goes to the later one);
    the average is checked against the states recorded at those updates. The 9th and last update falls
    between validations: `average` scores it too (4, not kept; then 6, kept beside update 8)."""
    model, loss = _problem()
    scores, seen, states = iter([3.0, 5.0, 1.0, 5.0, 4.0, 5.0, 6.0]), [], {}

    def score(scored):
        assert not scored.training and not torch.is_grad_enabled()
        seen.append(True)
        return next(scores)
    checkpoints = training.BestCheckpoints(score, every=2, keep=2)

    def on_update(trained, step):
        states[step] = copy.deepcopy(trained.state_dict())
        checkpoints(trained, step)
        assert trained.training
    training.fit(model, loss, 3, 9, lr=0.01, warmup=10, device="cpu", on_update=on_update)
    assert len(seen) == 4
    last = copy.deepcopy(model)
    assert checkpoints.average(model) == [{"step": 8, "valid_bleu": 5.0}, {"step": 4, "valid_bleu": 5.0}]
    assert len(seen) == 5
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, (states[8][name] + states[4][name]) / 2)
    assert not torch.allclose(states[8]["0.weight"], states[4]["0.weight"])  # the mean is not either state
    checkpoints = training.BestCheckpoints(score, every=2, keep=2)
    checkpoints(last, 8)  # scored 5
    checkpoints(last, 9)
    assert checkpoints.average(last) == [{"step": 9, "valid_bleu": 6.0}, {"step": 8, "valid_bleu": 5.0}]


def test_scoring_checkpoints_leaves_the_run_unchanged_and_needs_a_scored_update():
    plain, loss = _problem()
    _fit(plain, loss, 5)
    scored, loss = _problem()
    training.fit(scored, loss, 3, 5, lr=0.01, warmup=10, device="cpu",
                 on_update=training.BestCheckpoints(lambda m: 1.0, every=1, keep=5))
    for a, b in zip(plain.parameters(), scored.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="saw no update"):
        training.BestCheckpoints(lambda m: 1.0, every=10, keep=1).average(scored)
