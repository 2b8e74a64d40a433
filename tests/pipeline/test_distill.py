"""Distillation: Ray Data decoding equals the teacher called directly, whatever the actor count; KD
pairs that REDER cannot align fall back to the reference; a given distilled corpus is checked."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline import distill, tokenize
from pipeline.config import ConfigError, DistillConfig, load_config
from pipeline.stage import StageError
from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import load_teacher_dir, save_model_dir

VOCAB = 64


def _teachers(tmp_path: Path) -> dict[str, str]:
    """Two tiny random teachers saved as model directories (one per direction)."""
    spm_file = tmp_path / "spm.model"
    spm_file.write_bytes(b"not parsed by the decoder")
    dirs = {}
    for seed, direction in enumerate(("src2tgt", "tgt2src")):
        torch.manual_seed(seed)
        model = Transformer(TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1,
                                              decoder_layers=1, dropout=0.0, max_positions=128)).eval()
        dirs[direction] = str(save_model_dir(tmp_path / direction, model, spm_file, "en", "de",
                                             extra={"direction": direction}))
    return dirs


def _load(teacher_dirs: dict[str, str]) -> dict[str, Transformer]:
    return {d: load_teacher_dir(Path(p), d, VOCAB, "cpu") for d, p in teacher_dirs.items()}


def _train_split(directory: Path, rows: int = 40) -> Path:
    rng = random.Random(3)
    sides = [[[rng.randrange(4, VOCAB - 1) for _ in range(rng.randint(1, 9))] for _ in range(rows)] for _ in range(2)]
    ids = pa.list_(pa.int32())
    table = pa.table({"id": pa.array(range(100, 100 + rows), pa.int64()), "src_ids": pa.array(sides[0], ids),
                      "tgt_ids": pa.array(sides[1], ids), "src_len": pa.array(map(len, sides[0]), pa.int32()),
                      "tgt_len": pa.array(map(len, sides[1]), pa.int32())}, schema=tokenize.SCHEMA)
    directory.mkdir(parents=True)
    pq.write_table(table.slice(0, rows // 2), directory / "part-00000.parquet")
    pq.write_table(table.slice(rows // 2), directory / "part-00001.parquet")
    return directory


@pytest.mark.slow
def test_ray_distillation_with_one_and_two_actors_equals_the_teacher_called_directly(tmp_path, ray_session):
    teachers = _teachers(tmp_path)
    train_dir = _train_split(tmp_path / "train")
    decoding = {"beam_size": 3, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 4}
    outputs = {}
    for workers in (1, 2):
        staging = tmp_path / f"staging-{workers}"
        used = distill.distill_on_ray(train_dir, staging, teachers, VOCAB,
                                      DistillConfig(workers=workers, batch_size=8, **decoding))
        assert used == workers
        outputs[workers] = pq.read_table(staging).sort_by("id").to_pylist()
    assert outputs[1] == outputs[2]

    references = tokenize.read_split(train_dir)
    models = _load(teachers)
    for direction, column, kd in (("src2tgt", "src_ids", "kd_tgt_ids"), ("tgt2src", "tgt_ids", "kd_src_ids")):
        direct = distill.decode(models[direction], references.column(column).to_pylist(), direction, **decoding)
        assert [row[kd] for row in outputs[1]] == direct
        assert any(direct) and all(len(h) <= int(1.2 * (len(x) + 1)) + 4
                                   for h, x in zip(direct, references.column(column).to_pylist()))
    assert [row["id"] for row in outputs[1]] == references.column("id").to_pylist()


def test_decode_does_not_depend_on_batch_size(tmp_path):
    teachers = _load(_teachers(tmp_path))
    inputs = tokenize.read_split(_train_split(tmp_path / "train", rows=12)).column("src_ids").to_pylist()
    decoding = {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 1.0, "max_len_b": 3}
    whole = distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=12, **decoding)
    assert distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=1, **decoding) == whole
    assert distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=5, **decoding) == whole


def test_the_ctranslate2_engine_decodes_as_our_search(tmp_path):
    """The UDF through CTranslate2 (teachers converted by the driver's `convert_teachers`) gives our greedy
    outputs exactly and our beam-4 outputs where the stopping rules agree (reder/ct2.py; tests/reder/test_ct2.py
    checks the differences), both directions, with the rows and ids kept."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
    from pipeline.spm import train as train_spm

    bible = Path(__file__).resolve().parents[1] / "data" / "bible_en_es"
    letters = set("abcdefghijklmnopqrstuvwxyz ")  # few enough characters for 64 pieces
    lines = ["".join(c for c in line.lower() if c in letters)
             for name in ("train.en", "train.es") for line in (bible / name).read_text(encoding="utf-8").splitlines()]
    teachers = _teachers(tmp_path)
    for path in teachers.values():
        (Path(path) / "spm.model").write_bytes(train_spm(lines, VOCAB))  # conversion reads the pieces
    converted = distill.convert_teachers({d: Path(p) for d, p in teachers.items()}, tmp_path / "ct2")
    batch = tokenize.read_split(_train_split(tmp_path / "train", rows=24)).select(["id", "src_ids", "tgt_ids"])
    for beam, agree in ((1, 24), (4, 20)):
        decoding = {"beam_size": beam, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 4}
        ours = distill.TeacherDecoder(teachers, VOCAB, decoding)(batch).to_pylist()
        theirs = distill.TeacherDecoder(teachers, VOCAB, decoding, ct2_dirs=converted)(batch).to_pylist()
        assert [row["id"] for row in theirs] == [row["id"] for row in ours] == batch.column("id").to_pylist()
        for column in ("kd_tgt_ids", "kd_src_ids"):
            same = sum(a[column] == b[column] for a, b in zip(ours, theirs))
            assert same >= agree, (beam, column, same)


def test_the_engine_is_checked_and_resolved(monkeypatch):
    with pytest.raises(ConfigError, match=r"distill.engine: must be one of \['auto', 'torch', 'ctranslate2'\], got 'ct2'"):
        load_config(None, ["distill.engine=ct2"])
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    assert distill.engine(DistillConfig()) == "torch"
    with pytest.raises(StageError, match="pip install -e '.\\[ct2\\]'"):
        distill.engine(DistillConfig(engine="ctranslate2"))
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: True)
    assert distill.engine(DistillConfig()) == distill.engine(DistillConfig(engine="ctranslate2")) == "ctranslate2"
    assert distill.engine(DistillConfig(engine="torch")) == "torch"


def _kd_table(src, tgt, kd_tgt, kd_src) -> pa.Table:
    ids = pa.list_(pa.int32())
    return pa.table({"id": pa.array(range(len(src)), pa.int64()), "src_ids": pa.array(src, ids),
                     "kd_tgt_ids": pa.array(kd_tgt, ids), "tgt_ids": pa.array(tgt, ids), "kd_src_ids": pa.array(kd_src, ids)})


def test_unalignable_teacher_outputs_fall_back_to_the_reference_and_are_counted():
    cfg = load_config(None, ["model.vocab_size=64", "model.upsample_ratio=2"])
    # src of 2 pieces: 6 CTC frames; kd_tgt of 6 pieces (+EOS = 7) cannot fit, of 5 pieces fits.
    table = _kd_table(src=[[5, 6], [5, 6]], tgt=[[7], [7, 8]], kd_tgt=[[9] * 1 + [10, 11, 12, 13, 14], [9, 10, 11, 12, 13]],
                      kd_src=[[5, 5, 5], [5, 6]])
    fixed, counts = distill.apply_fallbacks(table, cfg)
    assert counts == {"fallback_src2tgt": 1, "fallback_tgt2src": 1}  # [5, 5, 5] needs 4 + 2 repeats > 4 frames
    assert fixed.column("kd_tgt_ids").to_pylist() == [[7], [9, 10, 11, 12, 13]]
    assert fixed.column("kd_src_ids").to_pylist() == [[5, 6], [5, 6]]
    assert fixed.column("src_len").to_pylist() == [2, 2] and fixed.schema == distill.SCHEMA
    dag = load_config(None, ["model.vocab_size=64", "model.head=dag", "model.graph_upsample_ratio=2"])
    _, counts = distill.apply_fallbacks(table, dag)  # int(2·(2+2)) = 8 vertices ≥ 6 + 2: all fit
    assert counts == {"fallback_src2tgt": 0, "fallback_tgt2src": 0}


def test_a_given_distilled_corpus_is_checked(tmp_path):
    references = pa.table({"id": pa.array([0, 1], pa.int64()), "src_ids": pa.array([[5, 6], [7]], pa.list_(pa.int32())),
                           "tgt_ids": pa.array([[8], [9, 10]], pa.list_(pa.int32()))})
    good = _kd_table(src=[[5, 6], [7]], tgt=[[8], [9, 10]], kd_tgt=[[8, 8], [9]], kd_src=[[5], [7, 7]])
    (tmp_path / "good").mkdir()
    pq.write_table(good.select(["id", "kd_src_ids", "src_ids", "tgt_ids", "kd_tgt_ids"]), tmp_path / "good" / "a.parquet")
    table = distill.read_corpus(tmp_path / "good", references)
    assert table.column("kd_tgt_ids").to_pylist() == [[8, 8], [9]]

    cases = {"no Parquet files": None, "lacks column(s) ['kd_src_ids']": good.drop(["kd_src_ids"]),
             "expected a list of integer ids": good.set_column(2, "kd_tgt_ids", pa.array(["a", "b"])),
             "ids do not match": good.set_column(0, "id", pa.array([0, 5], pa.int64())),
             "src_ids differs": good.set_column(1, "src_ids", pa.array([[5, 6], [8]], pa.list_(pa.int32())))}
    for number, (message, bad) in enumerate(cases.items()):
        directory = tmp_path / f"bad{number}"
        directory.mkdir()
        if bad is not None:
            pq.write_table(bad, directory / "part.parquet")
        with pytest.raises(StageError, match=re.escape(message)):
            distill.read_corpus(directory, references)
