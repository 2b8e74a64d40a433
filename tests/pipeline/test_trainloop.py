"""pipeline.training.trainloop, the worker side: the shard (what its model cannot read left out, every rank's whole shard in
every epoch), checkpoints loaded with weights_only, validation (the blank penalty, stage two's output length, a
pair by direction, built at the first validation), the teacher pair against two runs, MLflow logging."""
import contextlib
import dataclasses
import math
import time
import copy
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.training import trainloop
from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.objectives.directional import TeacherObjective
from tests.pipeline import test_harness


def test_a_worker_leaves_out_the_examples_its_model_cannot_read_and_counts_them(tmp_path):
    """`model.head=dag model.graph_upsample_ratio=4` once died at the first update (`input of 528 positions
    (after upsampling) exceeds max_positions=512`): tokenize's filter does not know max_positions. The worker's
    shard leaves such examples out, per the model's own limit (a REDER's inputs; every sequence of a teacher
    pair), and says how many."""
    import pyarrow as pa

    from pipeline.parquet import write_split
    from tests.reder.helpers import tiny_model

    model = tiny_model(head="dag", graph_upsample_ratio=4.0, max_positions=48)
    limit = model.max_input_length() - 1  # pieces, EOS not counted
    assert limit == 10  # int(4 · (11 + 2)) = 52 > 48 vertices; int(4 · (10 + 2)) = 48
    lengths = [(3, 4), (limit, 2), (limit + 1, 2), (2, limit + 1), (limit, limit)]
    table = pa.table({"src_ids": [[5] * s for s, _ in lengths], "tgt_ids": [[6] * t for _, t in lengths]})
    write_split(table, tmp_path / "plain")
    examples, dropped = trainloop.read_shard(tmp_path / "plain", 0, 1, model)
    assert dropped == 2 and [(len(s), len(t)) for s, t in examples.rows(range(len(examples)))] == \
        [(3, 4), (limit, 2), (limit, limit)]
    model.embed_input(torch.full((1, limit + 1), 5), torch.tensor([limit + 1]), "src")  # the longest kept fits
    with pytest.raises(ValueError, match="exceeds max_positions=48"):
        model.embed_input(torch.full((1, limit + 2), 5), torch.tensor([limit + 2]), "src")
    # With KD, the inputs are src and kd_src (kd_tgt and tgt are targets: feasibility bounds them).
    kd = table.append_column("kd_tgt_ids", pa.array([[7] * 30] * 5)).append_column("kd_src_ids", table["src_ids"])
    write_split(kd, tmp_path / "kd")
    examples, dropped = trainloop.read_shard(tmp_path / "kd", 0, 1, model)
    assert dropped == 1 and len(examples) == 4
    # distill.references: each KD row, then the references as a row of their own (kd_tgt = tgt, kd_src = src)
    both, dropped = trainloop.read_shard(tmp_path / "kd", 0, 1, model, references=True)
    rows = both.rows(range(len(both)))
    assert dropped == 2 and len(both) == 8 and rows[:4] == examples.rows(range(4))
    assert rows[4:] == [(s, t, t, s) for s, t, _, _ in examples.rows(range(4))]
    with pytest.raises(trainloop.StageError, match="distill.references needs distilled pairs"):
        trainloop.read_shard(tmp_path / "plain", 0, 1, model, references=True)
    pair = trainloop.ModelPair({d: Transformer(TransformerConfig(vocab_size=20, d_model=8, n_heads=2, ffn_dim=16,
                                                                encoder_layers=1, decoder_layers=1, max_positions=m))
                               for d, m in (("src2tgt", 12), ("tgt2src", 11))})
    assert trainloop.length_limits(pair, ["src_ids", "tgt_ids"]) == {"src_ids": 10, "tgt_ids": 10}
    assert trainloop.read_shard(tmp_path / "plain", 0, 1, pair)[1] == 2
    assert trainloop.read_shard(tmp_path / "plain", 0, 1)[1] == 0  # no model: no filter


def test_every_rank_trains_on_its_whole_shard_in_every_epoch(monkeypatch):
    """`_epoch` once cut every rank to the smallest rank's batch count, so part of the larger shards was left
    out of every epoch. Now every rank has the largest count, the smaller ones training their first batches again."""
    import pyarrow as pa

    from pipeline.training.harness import ExampleTable, epoch_batches

    def shard(length: int) -> ExampleTable:
        return ExampleTable(pa.table({"src_ids": [[4 + i] * length for i in range(40)], "tgt_ids": [[6] * length] * 40}))

    train = TrainConfig(max_tokens=128)
    shards = [shard(3), shard(30)]  # rank 0 short sentences (few batches of many), rank 1 long ones (many of few)
    counts = [len(epoch_batches(shards[rank], train.max_tokens, train.seed, 0, rank, train.batch_tokens)) for rank in (0, 1)]
    assert counts[0] < counts[1]  # the ranks' own counts differ
    monkeypatch.setattr(trainloop, "all_reduce", lambda value, op, group=None: {"max": max, "min": min}[op](counts))
    for rank, shard in enumerate(shards):
        batches = trainloop._epoch(shard, train, 0, rank)
        trained = [example for batch in batches for example in batch]
        assert len(batches) == max(counts)
        assert sorted(set(map(repr, trained))) == sorted(set(map(repr, shard.rows(range(len(shard))))))
        assert len(trained) >= len(shard) and (len(trained) > len(shard)) == (counts[rank] < max(counts))
    # What the cut to the smallest count left out of this epoch: rank 1's last batches.
    cut = epoch_batches(shards[1], train.max_tokens, train.seed, 0, 1, train.batch_tokens)[: min(counts)]
    assert sum(len(batch) for batch in cut) < len(shards[1])


class _Checkpoint:
    """Ray's Checkpoint as `_load` uses it: a directory to read."""

    def __init__(self, directory) -> None:
        self.directory = directory

    @contextlib.contextmanager
    def as_directory(self):
        yield str(self.directory)


PLANTED: list[str] = []


class _Planted:
    """Unpickling this calls PLANTED.append: what a planted pickle would do with os.system."""

    def __reduce__(self):
        return (PLANTED.append, ("executed",))


def test_a_harness_state_round_trips_through_a_checkpoint_loaded_with_weights_only(monkeypatch):
    examples, cfg = test_harness._examples(), test_harness._config()
    first, _ = test_harness._run(cfg)
    first.fit_examples(examples, until=3)
    directory = Path(trainloop._save(copy.deepcopy(first.state_dict())))
    try:
        safe_only = []
        real_load = torch.load
        monkeypatch.setattr(torch, "load", lambda *a, **k: safe_only.append(k.get("weights_only")) or real_load(*a, **k))
        state = trainloop._load(_Checkpoint(directory), torch.device("cpu"))
    finally:
        shutil.rmtree(directory)
    assert safe_only == [True, True]
    resumed, _ = test_harness._run(cfg, seed=5)
    resumed.load_state_dict(state)  # optimizer moments, schedule (LambdaLR) and position all came through
    assert (resumed.step, resumed.position) == (first.step, first.position)
    assert resumed.scheduler.get_last_lr() == first.scheduler.get_last_lr()
    for name, value in first.optimizer.state_dict()["state"][0].items():
        torch.testing.assert_close(resumed.optimizer.state_dict()["state"][0][name], value)


def test_a_planted_pickle_in_train_state_is_refused_without_running(tmp_path):
    torch.save({"model": {}}, tmp_path / "model.pt")
    (tmp_path / trainloop.HISTORY_FILE).write_text("[]", encoding="utf-8")
    torch.save({"step": 3, "optimizer": _Planted()}, tmp_path / "train_state.pt")
    PLANTED.clear()
    with pytest.raises(ValueError, match=r"train_state\.pt: not loadable with torch\.load\(weights_only=True\)") as caught:
        trainloop._load(_Checkpoint(tmp_path), torch.device("cpu"))
    assert PLANTED == []
    assert str(tmp_path / "train_state.pt") in str(caught.value) and "\n" not in str(caught.value)
    (tmp_path / "train_state.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"train_state\.pt: corrupt or truncated"):
        trainloop._load(_Checkpoint(tmp_path), torch.device("cpu"))


def _valid_split(root: Path, model_dir: Path, src: list[str], tgt: list[str], src_text: list[str],
                 tgt_text: list[str]) -> tuple[Path, Path, Path]:
    """A tokenize-like directory (valid/: the ids of src and tgt), an ingest-like one (valid/: the text that
    scores them, src_text for tgt2src and tgt_text for src2tgt) and an spm directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    data, corpus, spm_dir = root / "tokenize", root / "ingest", root / "spm"
    for directory in (data / "valid", corpus / "valid", spm_dir):
        directory.mkdir(parents=True)
    ids = list(range(len(src)))[::-1]  # not in id order on disk: the Validator sorts by id
    pq.write_table(pa.table({"id": ids, "src_ids": [sp.encode(s) for s in src], "tgt_ids": [sp.encode(t) for t in tgt]}),
                   data / "valid" / "part-0.parquet")
    pq.write_table(pa.table({"id": ids, "src": src_text, "tgt": tgt_text}), corpus / "valid" / "part-0.parquet")
    shutil.copyfile(model_dir / "spm.model", spm_dir / "spm.model")
    return data, corpus, spm_dir


def test_validation_picks_each_directions_best_blank_penalty_and_the_train_stage_publishes_it(tiny_model_dir, tmp_path):
    """The Validator's BLEU per direction is the best of the grid's, each penalty scored as translate_ids
    with that penalty and sacreBLEU would (brute force); on a constructed case — references that are the model's
    own output under penalty −4 (src2tgt) and 0.5 (tgt2src) — it picks exactly those; the train stage's
    tune_blank_penalty sets them on the model it publishes. [0] validates as before (no penalty keys)."""
    import sentencepiece

    from pipeline.config import load_config
    from pipeline.metrics import corpus_scores
    from pipeline.stages.train import tune_blank_penalty
    from reder.checkpoint import load_model_dir
    from reder.decoding.run import encode_lines, translate_ids

    model, _ = load_model_dir(tiny_model_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tiny_model_dir / "spm.model"))
    src = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "dogs and cats are friends",
           "the dog sat", "a cat sang"]
    tgt = ["the bird ran", "cats are friends", "a song in the park", "the mat sat on a dog", "the cat", "dogs ran"]
    grid = (0.0, 0.5, -4.0, 3.0)

    def decode(lines: list[str], direction: str, penalty: float) -> list[str]:
        return [sp.decode(h) for h in translate_ids(model, encode_lines(sp, lines), direction, "greedy",
                                                    blank_penalty=penalty)]

    made = {"src2tgt": -4.0, "tgt2src": 0.5}
    references = {"src2tgt": decode(src, "src2tgt", -4.0), "tgt2src": decode(tgt, "tgt2src", 0.5)}
    data, corpus, spm_dir = _valid_split(tmp_path, tiny_model_dir, src, tgt, references["tgt2src"], references["src2tgt"])
    validator = trainloop.Validator({"ids": str(data / "valid"), "text": str(corpus / "valid")},
                                   (spm_dir / "spm.model").read_bytes(), 0, blank_penalties=grid)
    scores = validator(model)
    for direction, inputs in (("src2tgt", src), ("tgt2src", tgt)):
        brute = {p: corpus_scores(decode(inputs, direction, p), references[direction])["bleu"] for p in grid}
        assert len(set(brute.values())) > 1, brute  # the grid's penalties score differently: the pick can be wrong
        best = max(grid, key=lambda p: (brute[p], -abs(p), -p))
        assert best == made[direction]
        assert scores[f"blank_penalty_{direction}"] == best
        assert scores[f"bleu_{direction}"] == pytest.approx(brute[best])
        assert scores[f"bleu_{direction}_unpenalised"] == pytest.approx(brute[0.0])
    assert scores["valid_bleu"] == pytest.approx((scores["bleu_src2tgt"] + scores["bleu_tgt2src"]) / 2)
    plain = trainloop.Validator({"ids": str(data / "valid"), "text": str(corpus / "valid")},
                               (spm_dir / "spm.model").read_bytes(), 0)(model)
    assert set(plain) == {"bleu_src2tgt", "bleu_tgt2src", "valid_length_ratio_src2tgt", "valid_length_ratio_tgt2src",
                          "valid_bleu"}
    assert plain["bleu_src2tgt"] == pytest.approx(scores["bleu_src2tgt_unpenalised"])

    cfg = load_config(None, [f"evaluate.blank_penalties=[{', '.join(map(str, grid))}]", "train.valid_max_sentences=0"])
    assert tune_blank_penalty(model, cfg, data, corpus, spm_dir) == scores
    assert model.blank_penalty == made
    model.blank_penalty = {"src2tgt": 0.0, "tgt2src": 0.0}
    assert tune_blank_penalty(model, load_config(None, ["evaluate.blank_penalties=[0]"]), data, corpus, spm_dir) == {}
    assert model.blank_penalty == {"src2tgt": 0.0, "tgt2src": 0.0}


BIBLE = Path(__file__).resolve().parents[1] / "data" / "bible_en_es"


@pytest.mark.slow
def test_stage_two_keeps_both_directions_greedy_output_at_the_reference_length_and_their_validation_bleu_rising(tmp_path):
    """A small REDER, 60 updates on 48 short Bible pairs (validated on the same pairs: what is
    measured is the calibration of the output, not generalisation), stage two (FBA + CC, λ 0.1) on from update
    31, validated every 10 updates as the train stage does (the Validator with the default blank penalties).
    Once stage two is on, in both directions: the greedy output is 0.85-1.2 times the reference length, the
    validation BLEU never drops by more than 1.0 from one validation to the next and ends at >= 12, and CC falls.
    The decoding without a tuned blank penalty (blank_penalties=(0.0,) here) fails it: its src2tgt greedy output is 0.71,
    0.59 and 0.64 of the reference length at the validations with stage two on (the CTC blank over-predicted;
    docs/results/ctc_decoding.md)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sentencepiece

    from pipeline.stages import spm
    from pipeline.config import EvaluateConfig
    from pipeline.training.harness import Harness
    from reder import DuplexLoss, LossConfig, ModelConfig, REDER

    torch.set_num_threads(1)  # tiny matrices: a second thread only waits (20x slower on a loaded 2-core box)
    lines = {lang: (BIBLE / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "es")}
    pairs = [(en, es) for en, es in zip(lines["en"], lines["es"]) if max(len(en), len(es)) <= 80][:48]
    (tmp_path / "spm.model").write_bytes(spm.train([s for pair in pairs for s in pair], 256))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    ids = [(sp.encode(en), sp.encode(es)) for en, es in pairs]
    for name, table in (("ids", {"src_ids": [s for s, _ in ids], "tgt_ids": [t for _, t in ids]}),
                        ("text", {"src": [en for en, _ in pairs], "tgt": [es for _, es in pairs]})):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": list(range(len(pairs))), **table}), tmp_path / name / "part-0.parquet")
    validator = trainloop.Validator({"ids": str(tmp_path / "ids"), "text": str(tmp_path / "text")},
                                   (tmp_path / "spm.model").read_bytes(), 0, blank_penalties=EvaluateConfig().blank_penalties)
    aux_start = 30
    model = REDER(ModelConfig(vocab_size=256, d_model=64, n_heads=4, ffn_dim=128, layers_per_end=2, dropout=0.0,
                              max_positions=512, memory_efficient=False))
    objective = DuplexLoss(model, LossConfig(lambda_fba=0.1, lambda_cc=0.1, aux_start_step=aux_start))
    reports = []
    cfg = TrainConfig(lr=0.003, warmup_steps=10, max_tokens=100_000, max_steps=60, validate_every=10, log_every=10,
                      bf16=False)
    Harness(model, objective, cfg, "cpu", validate=validator,
            on_report=lambda metrics, _: reports.append(metrics)).fit_examples(ids)
    on = [r for r in reports if r["step"] >= aux_start]  # the switch-on's validation, then those with stage two
    assert [r["step"] for r in on] == [30, 40, 50, 60]
    assert all("train_fba_src2tgt" in r and "train_cc_tgt2src" in r for r in on[1:])  # stage two ran
    for direction in ("src2tgt", "tgt2src"):
        ratios = [r[f"valid_length_ratio_{direction}"] for r in on[1:]]
        bleu = [r[f"bleu_{direction}"] for r in on]
        assert all(0.85 <= ratio <= 1.2 for ratio in ratios), (direction, ratios)
        assert all(later >= earlier - 1.0 for earlier, later in zip(bleu, bleu[1:])), (direction, bleu)
        assert bleu[-1] >= 12, (direction, bleu)
        assert on[-1][f"train_cc_{direction}"] < on[1][f"train_cc_{direction}"], direction


def _pair_config(**overrides) -> dict:
    """A teacher-pair loop config's model and train parts (tiny, no dropout: two runs can be compared exactly)."""
    model = TransformerConfig(vocab_size=40, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1,
                              dropout=0.0, attention_dropout=0.0, max_positions=32)
    train = TrainConfig(lr=0.01, warmup_steps=20, max_tokens=64, max_steps=6, log_every=1, validate_every=100,
                        clip_norm=0.5, bf16=False, **overrides)
    return {"task": {"kind": "teacher"}, "model": dataclasses.asdict(model), "train": dataclasses.asdict(train),
            "loss": {}}


def test_one_harness_training_both_teachers_equals_two_runs_of_one_each():
    """The teacher pair (`build_task`'s ModelPair and PairObjective, one optimizer) trained on the same
    batches ends with each direction's parameters those of a run of that direction alone: both start from the run's
    seed, each reads every batch in its direction, and each is clipped to clip_norm on its own (0.5 binds here: one
    norm over both models would clip each differently), its norm reported as grad_norm_<direction>."""
    import random

    from pipeline.training.harness import Harness

    rng = random.Random(0)
    examples = [([rng.randint(4, 39) for _ in range(rng.randint(2, 7))], [rng.randint(4, 39) for _ in range(rng.randint(2, 7))])
                for _ in range(24)]
    config = _pair_config()
    cfg = TrainConfig(**{**config["train"], "adam_betas": tuple(config["train"]["adam_betas"])})
    torch.manual_seed(123)  # build_task seeds each model itself
    pair, objective, directions = trainloop.build_task(config)
    assert isinstance(pair, trainloop.ModelPair) and directions == ("src2tgt", "tgt2src")
    joint = Harness(pair, objective, cfg, "cpu")
    joint_reports = []
    joint.on_report = lambda metrics, _: joint_reports.append(metrics)
    joint.fit_examples(examples)
    singles = {}
    for direction in directions:
        torch.manual_seed(cfg.seed)
        model = Transformer(TransformerConfig(**config["model"]))
        reports = []
        Harness(model, TeacherObjective(model, direction), cfg, "cpu",
                on_report=lambda metrics, _: reports.append(metrics)).fit_examples(examples)
        singles[direction] = reports
        for (name, value), (_, alone) in zip(pair[direction].state_dict().items(), model.state_dict().items()):
            torch.testing.assert_close(value, alone, rtol=0, atol=1e-6, msg=f"{direction} {name}")
    for step, metrics in enumerate(joint_reports):
        for direction in directions:
            alone = singles[direction][step]
            assert metrics[f"grad_norm_{direction}"] == pytest.approx(alone["grad_norm"], rel=1e-5)
            assert metrics[f"train_nll_{direction}"] == pytest.approx(alone[f"train_nll_{direction}"], rel=1e-5)
        assert metrics["train_total"] == pytest.approx(sum(singles[d][step]["train_total"] for d in directions), rel=1e-5)
    assert max(r["grad_norm_src2tgt"] for r in joint_reports) > 2 * cfg.clip_norm  # the clipping bound


def test_mlflow_metrics_named_for_a_direction_go_to_its_run():
    routed = trainloop.route_metrics({"step": 4, "train_total": 3.0, "train_nll_src2tgt": 1.0, "train_nll_tgt2src": 2.0,
                                     "grad_norm": 5.0, "grad_norm_tgt2src": 4.0, "bleu_src2tgt": 7.0,
                                     "valid_nll_tgt2src": 1.5, "valid_bleu": 6.0, "lr": 0.1, "bleu_tgt2src": math.nan,
                                     "first_update_at": 1.8e9, "validation_seconds": 2.5},  # a clock reading is no metric
                                    "stage", {"src2tgt": "a", "tgt2src": "b"})
    assert routed == {"stage": {"train_total": 3.0, "grad_norm": 5.0, "valid_bleu": 6.0, "lr": 0.1, "validation_seconds": 2.5},
                      "a": {"train_nll_src2tgt": 1.0, "valid_bleu_src2tgt": 7.0},
                      "b": {"train_nll_tgt2src": 2.0, "grad_norm_tgt2src": 4.0, "valid_nll_tgt2src": 1.5}}
    assert trainloop.route_metrics({"step": 1, "train_ctc_src2tgt": 2.0}, "stage", {}) == {"stage": {"train_ctc_src2tgt": 2.0}}


def test_the_mlflow_logger_logs_on_its_own_thread_and_close_waits_for_it(tmp_path):
    """Rank 0's logger returns at once (MLflow's import and client are built on its thread, off the path
    to the first update); flush() (at every validation) and close() wait until every queued batch is in the
    store, each metric in its run; a failure is raised on the training thread at the next log, flush or check."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("t")
    stage, a, b = (client.create_run(experiment).info.run_id for _ in range(3))
    logger = trainloop._MlflowLogger({"uri": uri, "run_id": stage, "runs": {"src2tgt": a, "tgt2src": b}})
    started = time.perf_counter()
    for step in (1, 2, 3):
        logger.log({"step": step, "train_total": float(step), "train_nll_src2tgt": 0.5 * step, "bleu_tgt2src": 9.0061}, step)
    assert time.perf_counter() - started < 0.5  # nothing was waited for
    logger.flush()
    assert [m.value for m in client.get_metric_history(stage, "train_total")] == [1.0, 2.0, 3.0]
    logger.log({"step": 4, "train_total": 4.0}, 4)
    logger.close()
    logger.check()
    assert [m.value for m in client.get_metric_history(stage, "train_total")] == [1.0, 2.0, 3.0, 4.0]
    assert [m.step for m in client.get_metric_history(a, "train_nll_src2tgt")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(b, "valid_bleu_tgt2src")] == [1, 2, 3]
    assert client.get_metric_history(b, "valid_bleu_tgt2src")[0].value == 9.01  # BLEU as reported
    assert not client.get_metric_history(stage, "train_nll_src2tgt")
    broken = trainloop._MlflowLogger({"uri": uri, "run_id": "no-such-run"})
    broken.log({"step": 1, "lr": 0.1}, 1)
    with pytest.raises(RuntimeError, match="MLflow logging failed"):
        broken.flush()
    broken.log({"step": 2, "lr": 0.1}, 2)
    broken.close()
    unreachable = trainloop._MlflowLogger({"uri": "nowhere://at-all", "run_id": stage})  # no client: fails at once
    with pytest.raises(RuntimeError, match="MLflow logging failed"):  # at the log, or at the flush if it came first
        unreachable.log({"step": 1, "lr": 0.1}, 1)
        unreachable.flush()  # returns: every item is handled, logged or not
    unreachable.close()


def test_the_first_worker_of_a_node_samples_mlflows_system_metrics_into_the_run_and_never_fails_it(tmp_path, caplog):
    """With psutil installed (requirements.txt), MLflow's monitor logs CPU and host memory as
    `system/node_<rank>/...` into the stage's run; without it, or off, nothing is logged and nothing raises."""
    import importlib.util

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("t")).info.run_id
    trainloop.SystemMetrics({"uri": uri, "run_id": run, "system_metrics_s": 0}, 0).finish()  # off: no thread
    system = trainloop.SystemMetrics({"uri": uri, "run_id": run, "system_metrics_s": 0.2}, 1)
    time.sleep(1.5)
    system.finish()
    logged = set(client.get_run(run).data.metrics)
    if importlib.util.find_spec("psutil") is None:
        assert not logged and "no system metrics in MLflow" in caplog.text
    else:
        assert {"system/node_1/cpu_utilization_percentage", "system/node_1/system_memory_usage_megabytes"} <= logged
        short = client.create_run(client.get_run(run).info.experiment_id).info.run_id  # shorter than its interval
        system = trainloop.SystemMetrics({"uri": uri, "run_id": short, "system_metrics_s": 60}, 0)
        system.finish()
        assert "system/node_0/cpu_utilization_percentage" in client.get_run(short).data.metrics  # the last sample
    trainloop.SystemMetrics(None, 0).finish()  # tracking off


def test_the_validator_is_built_at_the_first_validation_and_decodes_a_pair_by_direction(tiny_model_dir, tmp_path):
    """Building the Validator (Parquet reads, SentencePiece) waits for the first validation; a ModelPair
    is scored direction by direction with its own model, as each model alone would be (valid_bleu: the mean). A
    sentence longer than the model reads (72 words, max_positions 64) is cut, not an error (it once stopped
    the DAG train stage at its first validation)."""
    src = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "the cat sat on the mat " * 12]
    tgt = ["the bird ran", "cats are friends", "a song in the park", "a dog ran in the park " * 12]
    data, corpus, spm_dir = _valid_split(tmp_path, tiny_model_dir, src, tgt, src, tgt)
    config = {"valid": {"ids": str(tmp_path / "nowhere"), "text": str(tmp_path / "nowhere")},
              "spm_proto": (spm_dir / "spm.model").read_bytes(), "blank_penalties": [0.0]}
    trainloop.lazy_validator(config, 0, ("src2tgt", "tgt2src"))  # nothing read yet: no error
    config["valid"] = {"ids": str(data / "valid"), "text": str(corpus / "valid")}
    torch.manual_seed(0)
    teachers = {d: Transformer(TransformerConfig(vocab_size=30, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1,
                                                 decoder_layers=1, max_positions=64)) for d in ("src2tgt", "tgt2src")}
    scores = trainloop.lazy_validator(config, 0, ("src2tgt", "tgt2src"))(trainloop.ModelPair(teachers))
    for direction, teacher in teachers.items():
        alone = trainloop.lazy_validator(config, 0, (direction,))(teacher)
        assert {k: v for k, v in scores.items() if k.endswith(direction)} == {k: v for k, v in alone.items() if k != "valid_bleu"}
    assert scores["valid_bleu"] == pytest.approx((scores["bleu_src2tgt"] + scores["bleu_tgt2src"]) / 2)
    assert {"valid_nll_src2tgt", "valid_nll_tgt2src"} <= set(scores)
