"""Distillation: Ray Data decoding equals the teacher called directly, whatever the actor count, in the
token-bounded, length-sorted batches the driver plans; KD pairs that REDER cannot align fall back to the
reference; a given distilled corpus is checked; `engine: auto` takes CTranslate2 on a GPU only where it
sees one."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline import graph
from pipeline.config import ConfigError, DistillConfig, load_config
from pipeline.stage import StageError
from pipeline.stages import distill, tokenize
from reder import EOS_ID, TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import load_teacher_dir, save_model_dir
from reder.decoding import run as decoding_run

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
    references = tokenize.read_split(_train_split(tmp_path / "train"))
    decoding = {"beam_size": 3, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 4}
    outputs = {}
    for workers in (1, 2):
        table, used = distill.distill_on_ray(references, teachers, VOCAB,
                                             DistillConfig(workers=workers, max_tokens=24, **decoding))
        assert used == workers
        outputs[workers] = table.to_pylist()
    assert outputs[1] == outputs[2]

    models = _load(teachers)
    for direction, column, kd in (("src2tgt", "src_ids", "kd_tgt_ids"), ("tgt2src", "tgt_ids", "kd_src_ids")):
        direct = distill.decode(models[direction], references.column(column).to_pylist(), direction, max_tokens=24,
                                **decoding)
        assert [row[kd] for row in outputs[1]] == direct
        assert any(direct) and all(len(h) <= int(1.2 * (len(x) + 1)) + 4
                                   for h, x in zip(direct, references.column(column).to_pylist()))
    assert [row["id"] for row in outputs[1]] == references.column("id").to_pylist()
    assert [row["src_ids"] for row in outputs[1]] == references.column("src_ids").to_pylist()


def test_a_gpu_actor_pool_is_built_with_a_batch_size_ray_data_accepts(tmp_path, ray_session):
    """Ray Data refuses an actor pool that holds GPUs without a batch size (the first GPU run of
    configs/multi30k_quick.yaml stopped there, after its teachers). Building the dataset is lazy: no GPU is
    needed to see it accepted."""
    train = tokenize.read_split(_train_split(tmp_path / "train"))
    cfg = DistillConfig(use_gpu=True, max_tokens=24)
    blocks = distill.work_blocks(train, cfg)
    assert len({block.num_rows for block in blocks}) > 1  # planned batches of several sizes
    for resources in ({"num_gpus": 1, "num_cpus": 4}, {"num_cpus": 1}):
        dataset = distill.decoding_dataset(blocks, {}, VOCAB, cfg, None, 1, resources)
        assert dataset.schema(fetch_if_missing=False) is None  # nothing ran: the check is in building it


def test_batches_are_sorted_by_length_and_bounded_in_tokens():
    lengths = [5, 2, 9, 2, 30, 4, 5, 1, 9, 3]
    batches = distill.plan_batches(lengths, max_tokens=12, batch_size=1)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))  # each input once
    flat = [i for batch in batches for i in batch]
    assert flat == sorted(range(len(lengths)), key=lambda i: lengths[i])  # length order, ties by index
    assert [[lengths[i] for i in batch] for batch in batches] == [[1, 2, 2, 3], [4, 5], [5], [9], [9], [30]]
    assert all(len(batch) * lengths[batch[-1]] <= 12 for batch in batches[:-1])  # the 30 goes alone
    assert distill.plan_batches(lengths, max_tokens=0, batch_size=4) == [flat[:4], flat[4:8], flat[8:]]


def test_the_work_blocks_hold_each_sentence_once_in_sorted_token_bounded_batches(tmp_path):
    train = tokenize.read_split(_train_split(tmp_path / "train", rows=40))
    config = DistillConfig(max_tokens=20, max_len_a=1.2, max_len_b=4)
    blocks = distill.work_blocks(train, config)
    seen = {"src2tgt": [], "tgt2src": []}
    costs = []
    for number, block in enumerate(blocks):
        assert set(block.column("batch").to_pylist()) == {number} and len(set(block.column("direction").to_pylist())) == 1
        direction, rows = block.column("direction")[0].as_py(), block.column("row").to_pylist()
        column = "src_ids" if direction == "src2tgt" else "tgt_ids"
        assert block.column("input_ids").to_pylist() == [train.column(column)[r].as_py() for r in rows]
        lengths = [len(x) + 1 for x in block.column("input_ids").to_pylist()]
        assert lengths == sorted(lengths) and (len(lengths) == 1 or len(lengths) * lengths[-1] <= 20)
        costs.append(len(lengths) * (1.2 * lengths[-1] + 4))
        seen[direction] += rows
    assert all(sorted(rows) == list(range(40)) for rows in seen.values())
    assert costs == sorted(costs, reverse=True) and len(blocks) > 4  # the costliest first


def test_an_actor_call_decodes_each_planned_batch_as_one_search(tmp_path, monkeypatch):
    """Ray Data may hand an actor several blocks at once: each planned batch is still one beam search of
    exactly its sentences, and the outputs are those of `decode` in the planned batches."""
    teachers = _teachers(tmp_path)
    train = tokenize.read_split(_train_split(tmp_path / "train", rows=16))
    decoding = {"beam_size": 2, "length_penalty": 1.0, "max_len_a": 1.0, "max_len_b": 3}
    blocks = distill.work_blocks(train, DistillConfig(max_tokens=30, **decoding))
    searched: list[list[list[int]]] = []
    translate_ids = decoding_run.translate_ids  # what `distill.decode` calls
    monkeypatch.setattr(decoding_run, "translate_ids", lambda model, sequences, *args, **kwargs: (
        searched.append(sequences), translate_ids(model, sequences, *args, **kwargs))[1])
    decoder = distill.TeacherDecoder(teachers, VOCAB, decoding)
    result = decoder(pa.concat_tables(blocks[:3]))
    assert searched == [[x + [EOS_ID] for x in block.column("input_ids").to_pylist()] for block in blocks[:3]]
    assert result.column("row").to_pylist() == pa.concat_tables(blocks[:3]).column("row").to_pylist()
    models, searched[:] = _load(teachers), []
    for block, kd in zip(blocks[:3], _split_by(result, [b.num_rows for b in blocks[:3]])):
        direction = block.column("direction")[0].as_py()
        inputs = train.column("src_ids" if direction == "src2tgt" else "tgt_ids").to_pylist()
        whole = distill.decode(models[direction], inputs, direction, max_tokens=30, **decoding)
        assert kd == [whole[r] for r in block.column("row").to_pylist()]


def _split_by(table: pa.Table, sizes: list[int]) -> list[list[list[int]]]:
    kd, parts, start = table.column("kd_ids").to_pylist(), [], 0
    for size in sizes:
        parts.append(kd[start : start + size])
        start += size
    return parts


def test_decode_does_not_depend_on_batch_size(tmp_path):
    teachers = _load(_teachers(tmp_path))
    inputs = tokenize.read_split(_train_split(tmp_path / "train", rows=12)).column("src_ids").to_pylist()
    decoding = {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 1.0, "max_len_b": 3}
    whole = distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=12, **decoding)
    assert distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=1, **decoding) == whole
    assert distill.decode(teachers["src2tgt"], inputs, "src2tgt", batch_size=5, **decoding) == whole
    for max_tokens in (16, 40):  # token-bounded batches of several sizes: outputs as any other batching
        assert distill.decode(teachers["src2tgt"], inputs, "src2tgt", max_tokens=max_tokens, **decoding) == whole


def test_the_ctranslate2_engine_decodes_as_our_search(tmp_path):
    """The UDF through CTranslate2 (teachers converted by the driver's `convert_teachers`) gives our greedy
    outputs exactly and our beam-4 outputs where the stopping rules agree (reder/ct2.py; tests/reder/test_ct2.py
    checks the differences), both directions, with the rows and ids kept."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
    from pipeline.stages.spm import train as train_spm

    bible = Path(__file__).resolve().parents[1] / "data" / "bible_en_es"
    letters = set("abcdefghijklmnopqrstuvwxyz ")  # few enough characters for 64 pieces
    lines = ["".join(c for c in line.lower() if c in letters)
             for name in ("train.en", "train.es") for line in (bible / name).read_text(encoding="utf-8").splitlines()]
    teachers = _teachers(tmp_path)
    for path in teachers.values():
        (Path(path) / "spm.model").write_bytes(train_spm(lines, VOCAB))  # conversion reads the pieces
    converted = distill.convert_teachers({d: Path(p) for d, p in teachers.items()}, tmp_path / "ct2")
    train = tokenize.read_split(_train_split(tmp_path / "train", rows=24))
    for beam, agree in ((1, 24), (4, 20)):
        decoding = {"beam_size": beam, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 4}
        work = pa.concat_tables(distill.work_blocks(train, DistillConfig(max_tokens=64, **decoding)))
        ours = distill.TeacherDecoder(teachers, VOCAB, decoding)(work).to_pylist()
        theirs = distill.TeacherDecoder(teachers, VOCAB, decoding, ct2_dirs=converted)(work).to_pylist()
        assert [row["row"] for row in theirs] == [row["row"] for row in ours] == work.column("row").to_pylist()
        for direction in ("src2tgt", "tgt2src"):
            pairs = [(a["kd_ids"], b["kd_ids"]) for a, b in zip(ours, theirs) if a["direction"] == direction]
            same = sum(a == b for a, b in pairs)
            assert len(pairs) == 24 and same >= agree, (beam, direction, same)


def test_the_engine_is_checked_and_resolved(monkeypatch):
    with pytest.raises(ConfigError, match=r"distill.engine: must be one of \['auto', 'torch', 'ctranslate2'\], got 'ct2'"):
        load_config(None, ["distill.engine=ct2"])
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    assert distill.engine(DistillConfig()) == distill.engine(DistillConfig(use_gpu=True)) == "torch"
    with pytest.raises(StageError, match="pip install -e '.\\[ct2\\]'"):
        distill.engine(DistillConfig(engine="ctranslate2"))
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: True)
    monkeypatch.setattr(distill, "ctranslate2_cuda", lambda: (0, "no cuBLAS 12"))
    assert distill.engine(DistillConfig()) == distill.engine(DistillConfig(engine="ctranslate2")) == "ctranslate2"
    assert distill.engine(DistillConfig(engine="torch")) == distill.engine(DistillConfig(engine="torch", use_gpu=True)) == "torch"
    # On the GPU auto takes CTranslate2 only where it can decode on CUDA, and says why not
    assert distill.engine_choice(DistillConfig(use_gpu=True)) == (
        "torch", "auto: our search on the GPU, as CTranslate2 cannot decode on CUDA here: no cuBLAS 12")
    assert distill.engine(DistillConfig(use_gpu=True, engine="ctranslate2")) == "ctranslate2"  # asked for: as asked
    monkeypatch.setattr(distill, "ctranslate2_cuda", lambda: (1, ""))
    assert distill.engine_choice(DistillConfig(use_gpu=True)) == ("ctranslate2", "auto: CTranslate2 decodes on 1 CUDA device(s) here")


def test_ctranslate2_on_cuda_needs_a_device_and_cuda_12s_cublas(monkeypatch):
    """The wheels' device count needs only the driver (their CUDA runtime is linked in); cuBLAS 12 is opened at
    the first product, so a GPU without it (a CUDA 13 image) must not count as one CTranslate2 can use."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    distill.ctranslate2_cuda.cache_clear()
    assert distill.ctranslate2_cuda() == (0, "ctranslate2.get_cuda_device_count() is 0")
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 2)
    monkeypatch.setattr(distill, "CT2_CUDA_LIBRARIES", ("libm.so.6", "libduplex-absent.so.12"))
    distill.ctranslate2_cuda.cache_clear()
    devices, why_not = distill.ctranslate2_cuda()
    assert devices == 0 and why_not.startswith("CTranslate2 sees 2 CUDA device(s) but libduplex-absent.so.12 does not load")
    monkeypatch.setattr(distill, "CT2_CUDA_LIBRARIES", ("libm.so.6",))  # a library that loads everywhere
    distill.ctranslate2_cuda.cache_clear()
    assert distill.ctranslate2_cuda() == (2, "")
    distill.ctranslate2_cuda.cache_clear()


def test_the_stage_key_names_neither_batching_nor_an_auto_that_falls_back(tmp_path, monkeypatch):
    """Batching changes no output, so it moves no directory; `auto` on a GPU where CTranslate2 cannot decode on
    CUDA runs our search and keeps its directory, where it can it distils into CTranslate2's."""
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: True)
    monkeypatch.setattr(distill, "ctranslate2_cuda", lambda: (0, "no cuBLAS 12"))
    base = ["data.source=files", "data.local_dir=/nonexistent/corpus", "distill.use_gpu=true"]
    ours = graph.output_dirs(load_config(None, base + ["distill.engine=torch"]), tmp_path)["distill"]
    for batching in (["distill.max_tokens=100"], ["distill.max_tokens=0", "distill.batch_size=7"]):
        assert graph.output_dirs(load_config(None, base + ["distill.engine=torch"] + batching), tmp_path)["distill"] == ours
    assert graph.output_dirs(load_config(None, base), tmp_path)["distill"] == ours
    monkeypatch.setattr(distill, "ctranslate2_cuda", lambda: (1, ""))
    converted = graph.output_dirs(load_config(None, base + ["distill.engine=ctranslate2"]), tmp_path)["distill"]
    assert graph.output_dirs(load_config(None, base), tmp_path)["distill"] == converted != ours


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
