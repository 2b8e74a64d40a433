"""The evaluate stage decodes a DAG model with its own decoders (greedy, lookahead, Viterbi)."""
import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import evaluate, spm
from pipeline.config import load_config
from reder import REDER, ModelConfig
from reder.checkpoint import save_model_dir
from tests.pipeline.conftest import make_pairs

VOCAB = 64


def test_dag_models_are_scored_and_timed_with_every_dag_decoder(tmp_path):
    pairs = make_pairs(12)
    (tmp_path / "spm.model").write_bytes(spm.train([s for pair in pairs for s in pair] * 5, VOCAB))
    corpus = tmp_path / "corpus"
    (corpus / "test").mkdir(parents=True)
    pq.write_table(pa.table({"id": list(range(len(pairs))), "src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}),
                   corpus / "test" / "part-00000.parquet")
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "model.head=dag", "model.graph_upsample_ratio=2",
                             "evaluate.splits=[test]", "evaluate.latency_sentences=2", "evaluate.throughput_batch=4"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, head="dag",
                              graph_upsample_ratio=2.0, link_heads=2, max_positions=128)).eval()
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    out = tmp_path / "out"
    out.mkdir()
    headline = evaluate.evaluate_model(model_dir, corpus, cfg, out, None)
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    decoders = ("greedy", "lookahead", "viterbi")
    assert set(results["scores"]) == {f"test.{d}.{decoder}" for d in ("src2tgt", "tgt2src") for decoder in decoders}
    assert all(f"{decoder}_latency_ms" in results["speed"] for decoder in decoders)
    for decoder in decoders:
        assert len((out / f"test.src2tgt.{decoder}.txt").read_text(encoding="utf-8").splitlines()) == len(pairs)
    assert headline["bleu_src2tgt"] == results["scores"]["test.src2tgt.greedy"]["bleu"]
