"""The cmlm stage: one CMLM per direction, both trained by one Ray Train run on KD rows, published as model
directories that translate and refine; when it is needed: test_graph.py."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece

from pipeline.config import load_config
from pipeline.stage import StageRun
from pipeline.stages import cmlm, spm
from reder import CMLM
from reder.checkpoint import load_cmlm_dir
from reder.decoding.run import encode_lines, translate_ids
from tests.pipeline.conftest import make_pairs

VOCAB = 64
TINY = ["cmlm.model.d_model=16", "cmlm.model.n_heads=2", "cmlm.model.ffn_dim=32", "cmlm.model.encoder_layers=1",
        "cmlm.model.decoder_layers=1", "cmlm.model.max_positions=128", "cmlm.train.num_workers=1",
        "cmlm.train.max_tokens=512", "cmlm.train.max_steps=4", "cmlm.train.warmup_steps=2", "cmlm.train.log_every=2",
        "cmlm.train.validate_every=2", "cmlm.train.keep_checkpoints=2", "cmlm.train.average_best=2",
        "cmlm.train.valid_max_sentences=8"]


def _inputs(tmp_path):
    """The stage's inputs as the earlier stages publish them: ingest's text, spm's model, tokenize's ids, and a
    distill-shaped training split (KD columns: here the other side reversed, so each direction is told apart)."""
    pairs = make_pairs(60)
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / spm.MODEL_FILE).write_bytes(spm.train([s for pair in pairs for s in pair] * 3, VOCAB))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm" / spm.MODEL_FILE))
    src, tgt = sp.encode([s for s, _ in pairs]), sp.encode([t for _, t in pairs])
    ids = pa.list_(pa.int32())
    for split in ("train", "valid"):
        (tmp_path / "ingest" / split).mkdir(parents=True)
        pq.write_table(pa.table({"id": list(range(60)), "src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}),
                       tmp_path / "ingest" / split / "part-00000.parquet")
        (tmp_path / "tokenize" / split).mkdir(parents=True)
        pq.write_table(pa.table({"id": list(range(60)), "src_ids": pa.array(src, ids), "tgt_ids": pa.array(tgt, ids)}),
                       tmp_path / "tokenize" / split / "part-00000.parquet")
    (tmp_path / "distill" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"id": list(range(60)), "src_ids": pa.array(src, ids), "kd_tgt_ids": pa.array(tgt, ids),
                             "tgt_ids": pa.array(tgt, ids), "kd_src_ids": pa.array([s[::-1] for s in src], ids)}),
                   tmp_path / "distill" / "train" / "part-00000.parquet")
    return {"data": tmp_path / "distill", "tokenize": tmp_path / "tokenize", "ingest": tmp_path / "ingest",
            "spm": tmp_path / "spm"}, sp, pairs


def test_the_stage_trains_both_cmlms_in_one_ray_train_run(tmp_path, ray_session):
    inputs, sp, pairs = _inputs(tmp_path)
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "data.src_lang=en", "data.tgt_lang=de",
                             f"workdir={tmp_path}", *TINY])
    out = tmp_path / "out"
    run = StageRun(cfg=cfg, workdir=tmp_path, out=tmp_path / "cmlm-test", inputs=inputs)
    counts = cmlm.build(run, out)
    assert {d: c["steps"] for d, c in counts.items()} == {"src2tgt": 4, "tgt2src": 4}
    dirs = cmlm.model_dirs(out)
    assert set(dirs) == {"src2tgt", "tgt2src"} and json.loads((out / cmlm.CMLMS_FILE).read_text())["tgt2src"] == "tgt2src/model"
    history = json.loads((out / "history.json").read_text())  # the pair's run: both directions' terms
    assert any("train_length_tgt2src" in entry and "train_nll_src2tgt" in entry for entry in history)
    encoded = encode_lines(sp, [t for _, t in pairs[:5]])
    for direction in ("src2tgt", "tgt2src"):
        model = load_cmlm_dir(dirs[direction], direction, VOCAB)
        assert isinstance(model, CMLM) and model.cfg.d_model == 16
        assert len(translate_ids(model, encoded, direction, "mask_predict", length_beam=2, iterations=2)) == 5
    # both directions trained by one Ray Train run
    assert sorted(p.name for p in (tmp_path / "ray_results").iterdir()) == ["cmlm-test"]
