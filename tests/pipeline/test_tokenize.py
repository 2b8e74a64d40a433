import json

import pyarrow.parquet as pq
import pytest

from pipeline import graph, ingest, spm, tokenize
from pipeline.config import load_config
from pipeline.stage import StageError
from reder.heads import CtcHead, DagHead, feasibility_rule
from tests.pipeline.conftest import make_pairs
from tests.pipeline.test_spm import reference_normalise


def test_feasibility_is_the_heads_and_its_key_is_unchanged():
    """The rules themselves are tested against the losses in tests/reder/test_heads.py."""
    ctc = load_config(None, [])
    dag = load_config(None, ["model.head=dag", "model.graph_upsample_ratio=3"])
    assert graph.BY_NAME["tokenize"].key(ctc) == {"upsample_ratio": ctc.model.upsample_ratio}
    assert graph.BY_NAME["tokenize"].key(dag) == {"head": "dag", "graph_upsample_ratio": 3.0}
    outcomes = set()
    for cfg, head, ratio in ((ctc, CtcHead, ctc.model.upsample_ratio), (dag, DagHead, 3.0)):
        for input_len, target in ((1, [5, 5, 5]), (2, [5, 6, 7, 8, 9]), (1, [5] * 7), (1, [5] * 8)):
            expected = head.feasible(input_len, target, ratio)
            assert feasibility_rule(cfg.model)(input_len, target) == expected
            outcomes.add(expected)
    assert outcomes == {True, False}


def test_worker_plan_never_takes_the_last_cpu():
    assert tokenize.plan_workers(0, 2.0) == (1, 1.0, 1.0)
    assert tokenize.plan_workers(2, 2.0) == (2, 0.5, 1.0)
    assert tokenize.plan_workers(0, 16.0) == (15, 1.0, 1.0)
    assert tokenize.plan_workers(1, 1.0) == (1, 0.5, 0.5)
    with pytest.raises(StageError, match="no free CPU"):
        tokenize.plan_workers(1, 0.0)


def _corpus(tmp_path):
    """Toy pairs plus pairs that are infeasible for CTC one way or the other (long vs one word,
    and a repeated word that needs blanks)."""
    pairs = make_pairs(700)
    long = "The big old dog runs with the small young cat near the green river and the tree."
    pairs += [("Dog.", long), (long, "Hund."), ("Dog dog.", "Hund hund hund hund hund hund hund hund.")] * 3
    directory = tmp_path / "corpus"
    directory.mkdir()
    for split, part in (("train", pairs), ("valid", pairs[:60] + pairs[-3:]), ("test", pairs[60:100])):
        for side, lang in enumerate(("en", "de")):
            (directory / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in part), encoding="utf-8")
    return directory


def test_one_and_two_workers_give_identical_output_that_matches_plain_sentencepiece(tmp_path, ray_session):
    corpus = _corpus(tmp_path)
    base = ["data.source=files", f"data.local_dir={corpus}", "data.tgt_lang=de", "data.max_length_ratio=100",
            "data.dedupe=false", "model.vocab_size=120", "tokenize.batch_size=64"]
    outputs = {}
    from cluster.connect import actor_pool_options

    # issue 56: on one node no actor restarts, so Ray's core prints no "constructor arguments ... max_restarts > 0"
    assert actor_pool_options() == {"max_restarts": 0}
    for workers in (1, 2):
        cfg = load_config(None, base + [f"tokenize.workers={workers}"])
        workdir = tmp_path / f"w{workers}"
        graph.run(cfg, workdir, "ingest")
        graph.run(cfg, workdir, "spm")
        outputs[workers] = graph.run(cfg, workdir, "tokenize")
        assert json.loads((outputs[workers] / "report.json").read_text())["workers"] == workers
    for split in ingest.SPLITS:
        files = {w: sorted(p.name for p in (outputs[w] / split).iterdir()) for w in outputs}
        assert files[1] == files[2] and files[1]
        for name in files[1]:
            assert (outputs[1] / split / name).read_bytes() == (outputs[2] / split / name).read_bytes()

    # Reference: plain single-process SentencePiece over the ingested text.
    cfg = load_config(None, base)
    processor = spm.load(graph.output_dir(cfg, tmp_path / "w1", "spm") / "spm.model", 120)
    report = json.loads((outputs[1] / "report.json").read_text())["splits"]
    for split in ingest.SPLITS:
        text = pq.read_table(graph.output_dir(cfg, tmp_path / "w1", "ingest") / split).to_pylist()
        table = tokenize.read_split(outputs[1] / split)
        assert table.schema == tokenize.SCHEMA
        rows = {row["id"]: row for row in table.to_pylist()}
        expected_drop = 0
        for pair in text:
            src_ids, tgt_ids = processor.encode(pair["src"]), processor.encode(pair["tgt"])
            feasible = CtcHead.feasible(len(src_ids), tgt_ids, 2) and CtcHead.feasible(len(tgt_ids), src_ids, 2)
            if not feasible:
                expected_drop += 1
                if split == "train":
                    assert pair["id"] not in rows
                    continue
            row = rows[pair["id"]]
            assert (row["src_ids"], row["tgt_ids"]) == (src_ids, tgt_ids)
            assert (row["src_len"], row["tgt_len"]) == (len(src_ids), len(tgt_ids))
            assert processor.decode(row["src_ids"]) == reference_normalise(pair["src"])
            assert processor.decode(row["tgt_ids"]) == reference_normalise(pair["tgt"])
        assert table.column("id").to_pylist() == sorted(rows)
        assert report[split]["infeasible"] == expected_drop
        assert report[split]["kept"] == len(text) - (expected_drop if split == "train" else 0)
    assert report["train"]["infeasible_src2tgt"] >= 3 and report["train"]["infeasible_tgt2src"] >= 3
    assert report["valid"]["infeasible"] >= 3 and report["valid"]["dropped"] == 0


def test_tokenize_needs_spm_first(tmp_path):
    corpus = _corpus(tmp_path)
    cfg = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.tgt_lang=de"])
    graph.run(cfg, tmp_path / "w", "ingest")
    with pytest.raises(StageError, match="stage 'spm' has no finished output"):
        graph.run(cfg, tmp_path / "w", "tokenize")
