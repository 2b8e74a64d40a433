"""The train stage's pieces: schedule, batching, resource check; resume through Ray Train (slow)."""
import json
import math
import random
from pathlib import Path

import pytest

import run_pipeline
from pipeline import train
from pipeline.config import TrainConfig
from pipeline.stage import StageError

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def test_inverse_sqrt_warms_up_linearly_then_decays_as_fairseq():
    lr, warmup, init = 1e-3, 100, 1e-7
    assert train.inverse_sqrt(0, lr, warmup, init) == pytest.approx(init + (lr - init) / warmup)  # step 0 acts as 1
    assert train.inverse_sqrt(50, lr, warmup, init) == pytest.approx(init + 50 * (lr - init) / warmup)
    assert train.inverse_sqrt(100, lr, warmup, init) == pytest.approx(lr)
    assert train.inverse_sqrt(400, lr, warmup, init) == pytest.approx(lr / 2)  # lr * sqrt(100 / 400)
    assert train.inverse_sqrt(10_000, lr, 0, init) == pytest.approx(lr / 100)  # no warm-up: lr / sqrt(step)
    values = [train.inverse_sqrt(s, lr, warmup, init) for s in range(1, 300)]
    assert max(values) == pytest.approx(lr) and values.index(max(values)) == warmup - 1


def test_token_batches_cover_every_pair_once_within_the_budget():
    rng = random.Random(3)
    src = [rng.randint(1, 60) for _ in range(500)]
    tgt = [rng.randint(1, 60) for _ in range(500)]
    src[7], tgt[7] = 300, 280  # longer than the budget on its own: a batch of one
    batches = train.token_batches(src, tgt, max_tokens=400, seed=5)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        cost = len(batch) * (max(src[i] + 1 for i in batch) + max(tgt[i] + 1 for i in batch))
        assert cost <= 400 or len(batch) == 1
    assert [7] in batches
    assert train.token_batches(src, tgt, 400, seed=5) == batches  # deterministic
    assert train.token_batches(src, tgt, 400, seed=6) != batches  # the seed reshuffles
    sizes = sorted(len(b) for b in batches)
    assert sizes[-1] >= 3 and sum(sizes) / len(sizes) > 2  # buckets fill up: not one pair per batch


def test_an_unsatisfiable_request_fails_fast_with_the_numbers(ray_session):
    with pytest.raises(StageError, match=r"GPU: need 2, cluster has 0.*use_gpu=false"):
        train.check_resources(TrainConfig(num_workers=2, use_gpu=True), timeout_s=0.5)
    with pytest.raises(StageError, match=r"CPU: need 12, cluster has 2"):
        train.check_resources(TrainConfig(num_workers=3, cpus_per_worker=4), timeout_s=0.5)
    train.check_resources(TrainConfig(num_workers=2), timeout_s=0.5)  # fits: returns


@pytest.mark.slow
def test_an_interrupted_run_continues_from_its_checkpoint(tmp_path, capsys, ray_session):
    """A run that dies after the step-10 checkpoint (no restarts allowed) publishes nothing; started
    again it resumes at step 10 with the optimizer state and reaches max_steps, not 10 + max_steps."""
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=20",
            "loss.aux_start_step=15", "distill.enabled=false", "evaluate.teacher_baseline=false"]
    failing = args + ["train.fail_at_step=12", "train.max_failures=0", "--stages", "ingest,spm,tokenize,train"]
    assert run_pipeline.main(failing) == 2
    assert "fault drill: train.fail_at_step=12" in capsys.readouterr().err
    assert not list(tmp_path.glob("train-*"))  # nothing half-published

    assert run_pipeline.main(args + ["--stages", "train"]) == 0
    out = list(tmp_path.glob("train-*"))
    assert len(out) == 1  # fail_at_step and max_failures are not part of the stage's identity
    history = json.loads((out[0] / "history.json").read_text())
    resumed = [entry for entry in history if "resumed_from" in entry]
    assert resumed == [{"step": 10, "resumed_from": 10}]
    steps = [entry["step"] for entry in history]
    assert steps == sorted(steps) and steps[-1] == 20 and steps.count(10) == 2  # 10 logged, then resumed at 10
    report = json.loads((out[0] / "report.json").read_text())
    assert report["steps"] == 20 and report["restarts"] == 1
    after = history[history.index(resumed[0]) + 1]
    assert after["step"] == 15 and math.isfinite(after["train_total"])
    # the schedule went on from step 10 rather than restarting its warm-up
    assert after["lr"] == pytest.approx(train.inverse_sqrt(15, 0.002, 10, 1e-7))


def test_kd_examples_train_each_direction_on_its_own_distilled_pairs():
    """A KD micro-batch: src2tgt on (x, teacher(x)), tgt2src on (teacher(y), y); DuplexLoss runs both in one
    forward and its terms equal two separate one-direction losses."""
    import torch

    from reder import DuplexLoss, LossConfig
    from tests.reder.helpers import tiny_model

    examples = [([4, 5, 6], [7, 8], [9], [10, 4, 5, 6]), ([5], [6, 7, 8], [4, 4, 9], [5, 5])]  # src, tgt, kd_tgt, kd_src
    forward, backward = train.passes(examples, torch.device("cpu"))
    assert forward[0].tolist() == [[4, 5, 6, 3], [5, 3, 0, 0]] and forward[2].tolist() == [[9, 3, 0, 0], [4, 4, 9, 3]]
    assert backward[0].tolist() == [[10, 4, 5, 6, 3], [5, 5, 3, 0, 0]] and backward[2].tolist() == [[7, 8, 3, 0], [6, 7, 8, 3]]
    reference, none = train.passes([e[:2] for e in examples], torch.device("cpu"))
    assert none is None and reference[2].tolist() == [[7, 8, 3, 0], [6, 7, 8, 3]]

    model = tiny_model(LossConfig(aux_start_step=0), dropout=0.0, attention_dropout=0.0).double()
    model.initialize(*forward)  # ActNorm from one batch, so both evaluations below see the same model
    joint = DuplexLoss(model)(*forward, 1, tgt2src_batch=backward)
    alone = {**model.loss(*forward, 1, ("src2tgt",)), **model.loss(*backward, 1, ("tgt2src",))}
    for name in ("ctc_src2tgt", "fba_src2tgt", "cc_src2tgt", "ctc_tgt2src", "fba_tgt2src", "cc_tgt2src"):
        torch.testing.assert_close(joint[name], alone[name])
    assert joint["fba_tgt2src"] > 0 and joint["cc_src2tgt"] > 0
    lam = model.loss_config
    expected = sum(alone[f"ctc_{d}"] + lam.lambda_fba * alone[f"fba_{d}"] + lam.lambda_cc * alone[f"cc_{d}"]
                   for d in ("src2tgt", "tgt2src"))
    torch.testing.assert_close(joint["total"], expected)


def test_teacher_objective_reads_the_batch_in_its_direction():
    import torch

    from reder import TransformerConfig
    from reder.autoregressive import Transformer

    model = Transformer(TransformerConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                          decoder_layers=1, dropout=0.0, max_positions=32))
    src, src_lengths = train.pad_batch([[4, 5, 3], [6, 3]])
    tgt, tgt_lengths = train.pad_batch([[7, 3], [8, 9, 10, 3]])
    forward = train.TeacherObjective(model, "src2tgt")(src, src_lengths, tgt, tgt_lengths, 0)
    backward = train.TeacherObjective(model, "tgt2src")(src, src_lengths, tgt, tgt_lengths, 0)
    assert set(forward) == {"nll_src2tgt", "total"} and set(backward) == {"nll_tgt2src", "total"}
    torch.testing.assert_close(forward["total"], model.loss(src, src_lengths, tgt, tgt_lengths)["total"])
    torch.testing.assert_close(backward["nll_tgt2src"], model.loss(tgt, tgt_lengths, src, src_lengths)["nll"])
