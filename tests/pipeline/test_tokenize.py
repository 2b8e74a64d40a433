import json

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from pipeline import graph, ingest, spm, tokenize
from pipeline.config import load_config
from pipeline.stage import StageError
from reder import REDER, ModelConfig
from reder.config import BOS_ID, EOS_ID
from reder.dag import dag_log_likelihood, edge_mask, masked_log_softmax, target_emissions
from tests.pipeline.conftest import make_pairs
from tests.pipeline.test_spm import reference_normalise


def ctc_loss_is_finite(input_len: int, target: list[int], ratio: int) -> bool:
    """Reference: torch's CTC on T = ratio*(input_len+1) frames for target+EOS (inf when infeasible)."""
    frames = ratio * (input_len + 1)
    labels = torch.tensor(target + [EOS_ID])
    log_probs = torch.randn(frames, 1, 20).log_softmax(-1)
    loss = F.ctc_loss(log_probs, labels[None], torch.tensor([frames]), torch.tensor([len(labels)]),
                      blank=19, reduction="sum", zero_infinity=False)
    return bool(torch.isfinite(loss))


def test_ctc_feasibility_matches_torch_ctc_loss():
    generator = torch.Generator().manual_seed(0)
    cases = [(0, [], 1), (0, [5], 1), (0, [5, 5], 2), (1, [5, 5, 5], 2), (2, [4, 5, 6, 7, 8], 2),
             (2, [4, 5, 6, 7, 8, 9], 2), (1, [4, 4], 2), (3, [4, 4, 4, 4], 2)]
    for _ in range(200):
        input_len = int(torch.randint(0, 6, (1,), generator=generator))
        target = torch.randint(4, 7, (int(torch.randint(0, 14, (1,), generator=generator)),),
                               generator=generator).tolist()
        cases.append((input_len, target, int(torch.randint(1, 4, (1,), generator=generator))))
    outcomes = set()
    for input_len, target, ratio in cases:
        expected = ctc_loss_is_finite(input_len, target, ratio)
        assert tokenize.ctc_feasible(input_len, target, ratio) == expected, (input_len, target, ratio)
        outcomes.add(expected)
    assert outcomes == {True, False}


def dag_path_exists(input_len: int, target: list[int], ratio: float) -> bool:
    """Reference: the DAG model's own graph for BOS x EOS and its DP for BOS y EOS (−inf without a path)."""
    model = REDER(ModelConfig(vocab_size=20, d_model=8, n_heads=2, ffn_dim=8, layers_per_end=1, head="dag",
                              graph_upsample_ratio=ratio, link_heads=2, max_positions=256))
    _, graph_lengths = model.upsample(torch.tensor([[4] * input_len + [EOS_ID]]), torch.tensor([input_len + 1]))
    length = int(graph_lengths[0])
    log_edges = masked_log_softmax(torch.randn(1, length, length), edge_mask(graph_lengths, length), dim=-1)
    targets = torch.tensor([[BOS_ID, *target, EOS_ID]])
    emissions = target_emissions(torch.randn(1, length, 20).log_softmax(-1), targets)
    return bool(torch.isfinite(dag_log_likelihood(log_edges, emissions, graph_lengths, torch.tensor([targets.shape[1]]))))


def test_dag_feasibility_matches_the_models_graph_and_dp():
    generator = torch.Generator().manual_seed(0)
    cases = [(0, [], 1.0), (0, [5], 1.0), (0, [5], 1.5), (3, [5, 5, 5, 5, 5], 1.4), (3, [5] * 5, 1.5), (2, [4] * 30, 8.0)]
    for _ in range(100):
        input_len = int(torch.randint(0, 8, (1,), generator=generator))
        target = [5] * int(torch.randint(0, 20, (1,), generator=generator))
        ratio = round(1 + 3 * float(torch.rand(1, generator=generator)), 2)
        cases.append((input_len, target, ratio))
    outcomes = set()
    for input_len, target, ratio in cases:
        expected = dag_path_exists(input_len, target, ratio)
        assert tokenize.dag_feasible(input_len, target, ratio) == expected, (input_len, target, ratio)
        outcomes.add(expected)
    assert outcomes == {True, False}
    ctc = load_config(None, [])
    dag = load_config(None, ["model.head=dag", "model.graph_upsample_ratio=3"])
    assert tokenize.feasibility_key(ctc) == {"upsample_ratio": ctc.model.upsample_ratio}
    assert tokenize.feasibility_key(dag) == {"head": "dag", "graph_upsample_ratio": 3.0}


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
            feasible = (tokenize.ctc_feasible(len(src_ids), tgt_ids, 2)
                        and tokenize.ctc_feasible(len(tgt_ids), src_ids, 2))
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
