import json
import random
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import graph, parquet
from pipeline.config import load_config
from pipeline.stage import StageError
from pipeline.stages import ingest, spm, tokenize
from reder.feasibility import config_rule
from reder.heads import CtcHead, DagHead
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
            assert config_rule(cfg.model)(input_len, target) == expected
            outcomes.add(expected)
    assert outcomes == {True, False}


def test_the_tokenize_actor_loads_without_torch_and_its_rule_is_each_heads():
    """A tokenize actor unpickles `Tokenizer` as Ray does (by reference: it imports the class's module and what that
    imports): NumPy, PyArrow, SentencePiece and reder.feasibility, never torch (~150 MB more in each actor). Every head
    has its rule there, and the heads' `feasible` is that rule."""
    import subprocess

    import ray.cloudpickle

    from pipeline.stages.tokenize_actor import Tokenizer
    from reder import feasibility
    from reder.heads import HEADS

    pickled = ray.cloudpickle.dumps(Tokenizer)
    script = ("import pickle, sys\n"
              "cls = pickle.loads(sys.stdin.buffer.read())\n"
              "assert cls.__module__ == 'pipeline.stages.tokenize_actor', cls.__module__\n"
              "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    done = subprocess.run([sys.executable, "-c", script], input=pickled, capture_output=True, timeout=60,
                          cwd=str(graph.__file__).rsplit("/pipeline/", 1)[0])
    assert done.returncode == 0 and done.stdout.decode().strip() == "[]", (done.stdout, done.stderr[-2000:])
    assert set(feasibility.RULES) == set(HEADS)
    assert all(HEADS[name].feasible is feasibility.rule(name) for name in HEADS)
    with pytest.raises(ValueError, match="unknown head 'rnn'"):
        feasibility.rule("rnn")


def test_worker_plan_never_takes_the_last_cpu_and_starts_an_actor_only_for_work_worth_its_start():
    assert tokenize.plan_workers(0, 2.0, 10**7) == (1, 1.0, 1.0)
    assert tokenize.plan_workers(2, 2.0, 100) == (2, 0.5, 1.0)  # as asked, whatever the rows
    assert tokenize.plan_workers(0, 16.0, 10**7) == (15, 1.0, 1.0)
    assert tokenize.plan_workers(1, 1.0, 100) == (1, 0.5, 0.5)
    per_actor = tokenize.ROWS_PER_ACTOR
    assert tokenize.plan_workers(0, 16.0, 29_000) == (1, 1.0, 1.0)  # Multi30k: one actor on 16 CPUs
    assert [tokenize.plan_workers(0, 16.0, rows)[0] for rows in (per_actor, per_actor + 1, 3 * per_actor)] == [1, 2, 3]
    with pytest.raises(StageError, match="no free CPU"):
        tokenize.plan_workers(1, 0.0, 100)


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

    # on one node no actor restarts, so Ray's core prints no "constructor arguments ... max_restarts > 0"
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


STAGED = pa.schema([("split", pa.string()), ("id", pa.int64()), ("src_ids", pa.list_(pa.int32())),
                    ("tgt_ids", pa.list_(pa.int32())), ("src_len", pa.int32()), ("tgt_len", pa.int32()),
                    ("feasible_src2tgt", pa.bool_()), ("feasible_tgt2src", pa.bool_())])


def _staged_rows(split, ids, seed):
    rng = random.Random(seed)
    rows = []
    for row_id in ids:
        src = [rng.randrange(100) for _ in range(rng.randint(0, 6))]
        tgt = [rng.randrange(100) for _ in range(rng.randint(0, 6))]
        rows.append({"split": split, "id": row_id, "src_ids": src, "tgt_ids": tgt, "src_len": len(src),
                     "tgt_len": len(tgt), "feasible_src2tgt": rng.random() > 0.2, "feasible_tgt2src": rng.random() > 0.2})
    return rows


def _write_staging(staging, blocks, seed=0):
    """Staged files as Ray Data writes them (names that do not sort by id, splits mixed, rows of a block
    in id order); each of `blocks` is a list of (split, ids) runs."""
    staging.mkdir()
    for index, runs in enumerate(blocks):
        rows = [row for k, (split, ids) in enumerate(runs) for row in _staged_rows(split, ids, seed + 31 * index + k)]
        name = f"{(index * 7919) % 101:03d}_000000.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=STAGED), staging / name)


def _finalize_whole(staging, split, out, drop):
    """As it was once: every staged row read at once, the split filtered and sorted, written by write_split."""
    staged = pq.read_table(staging)
    table = staged.filter(pc.equal(staged.column("split"), split)).sort_by("id")
    forward, backward = table.column("feasible_src2tgt"), table.column("feasible_tgt2src")
    feasible = pc.and_(forward, backward)
    counts = {"read": table.num_rows,
              "infeasible_src2tgt": table.num_rows - pc.sum(forward).as_py() if table.num_rows else 0,
              "infeasible_tgt2src": table.num_rows - pc.sum(backward).as_py() if table.num_rows else 0,
              "infeasible": table.num_rows - pc.sum(feasible).as_py() if table.num_rows else 0}
    if drop:
        table = table.filter(feasible)
    counts["kept"] = table.num_rows
    counts["dropped"] = counts["read"] - counts["kept"]
    table = pa.table({name: table.column(name).combine_chunks() for name in tokenize.SCHEMA.names},
                     schema=tokenize.SCHEMA)
    counts["src_tokens"] = pc.sum(table.column("src_len")).as_py() or 0
    counts["tgt_tokens"] = pc.sum(table.column("tgt_len")).as_py() or 0
    parquet.write_split(table, out)
    return counts


BLOCKS = {  # each a list of staged files, each a list of (split, ids) runs
    "disjoint": [[("train", range(400, 650))], [("train", range(0, 400))],
                 [("train", range(650, 700)), ("valid", range(0, 90))], [("test", range(5, 80, 2))],
                 [("train", range(900, 1200))]],
    "overlapping": [[("train", list(range(0, 300)) + list(range(800, 900)))], [("train", range(300, 800))],
                    [("valid", range(50, 90)), ("train", range(950, 1000))],
                    [("valid", range(0, 50)), ("train", range(900, 950))], [("test", [3])]],
    "a split all dropped or absent": [[("valid", range(10))], [("train", range(0, 30))]],
}


@pytest.mark.parametrize("layout", list(BLOCKS))
def test_streamed_finalize_writes_the_files_and_counts_of_the_whole_split(tmp_path, monkeypatch, layout):
    """Byte for byte the files (and the counts) the driver wrote when it held every staged row, over staged
    files with disjoint or interleaved id ranges, across several part files (ROWS_PER_FILE made small)."""
    monkeypatch.setattr(parquet, "ROWS_PER_FILE", 64)
    _write_staging(tmp_path / "staging", BLOCKS[layout])
    if layout == "a split all dropped or absent":
        table = pq.read_table(tmp_path / "staging" / "041_000000.parquet")
        pq.write_table(table.set_column(6, "feasible_src2tgt", pa.array([False] * table.num_rows)),
                       tmp_path / "staging" / "041_000000.parquet")
    pieces = tokenize.staged_pieces(tmp_path / "staging")
    for split in ingest.SPLITS:
        drop = split == "train"
        expected = _finalize_whole(tmp_path / "staging", split, tmp_path / "whole" / split, drop)
        streamed = tokenize.in_id_order(pieces.get(split, []), split)
        counts = tokenize.finalize(streamed, tmp_path / "stream" / split, drop)
        assert counts == expected
        names = sorted(p.name for p in (tmp_path / "whole" / split).iterdir())
        assert names == sorted(p.name for p in (tmp_path / "stream" / split).iterdir())
        for name in names:
            assert (tmp_path / "stream" / split / name).read_bytes() == (tmp_path / "whole" / split / name).read_bytes()


def test_in_id_order_holds_one_staged_file_when_their_id_ranges_are_disjoint(tmp_path):
    """Memory: with disjoint pieces (what Ray Data's blocks of contiguous ingest rows give) each yielded table is
    exactly one staged file's rows of the split, so nothing is carried from one file to the next."""
    _write_staging(tmp_path / "staging", BLOCKS["disjoint"])
    pieces = tokenize.staged_pieces(tmp_path / "staging")
    assert [smallest for smallest, _ in pieces["train"]] == [0, 400, 650, 900]
    tables = list(tokenize.in_id_order(pieces["train"], "train"))
    assert [t.num_rows for t in tables] == [400, 250, 50, 300]
    assert pa.concat_tables(tables).column("id").to_pylist() == list(range(700)) + list(range(900, 1200))


def test_ray_data_s_no_cpu_warning_is_held_back_when_the_cpus_were_just_seen_free(tmp_path, ray_session, monkeypatch):
    """Ray Data warns "the Ray cluster currently does not have any available CPUs. The Dataset job will hang" when
    ray.available_resources() shows none as a write starts: after the Parquet sampling tasks that write_parquet
    runs first, the resource view can lag (a false alarm seen in a smoke run). Simulated here: the view shows
    every CPU free to tokenize's own wait and none to Ray Data's check. The stage says nothing of it, and the
    warning is armed again afterwards for a real hang."""
    import ray
    import ray.data.dataset
    from ray.util.debug import log_once, reset_log_once

    corpus = _corpus(tmp_path)
    cfg = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.tgt_lang=de",
                             "data.max_length_ratio=100", "data.dedupe=false", "model.vocab_size=120",
                             "tokenize.workers=1"])
    graph.run(cfg, tmp_path, "ingest")
    graph.run(cfg, tmp_path, "spm")
    real = ray.available_resources

    def lagging() -> dict:
        caller = sys._getframe(1).f_globals.get("__name__")
        return {**real(), "CPU": 0.0} if caller == "ray.data.dataset" else real()

    warned = []
    monkeypatch.setattr(ray, "available_resources", lagging)
    monkeypatch.setattr(ray.data.dataset.logger, "warning", lambda message, *args: warned.append(message))
    reset_log_once("cpu_warning")  # Ray Data's log_once key; as in a new process: not yet said
    graph.run(cfg, tmp_path, "tokenize")
    assert not [m for m in warned if "available CPUs" in m], warned
    assert log_once("cpu_warning")  # armed again: a later dataset that really lacks CPUs is warned of
