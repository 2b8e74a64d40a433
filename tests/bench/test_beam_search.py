"""bench.beam_search on tiny random teachers laid out as a teacher stage does: timing the network calls leaves
the search's outputs as they are, and the split adds up."""
import json

import pytest

from bench import beam_search
from pipeline.stages import spm, teacher
from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import save_model_dir
from tests.conftest import SHARED_DATA


def test_the_split_times_the_network_without_changing_what_the_search_finds(tmp_path):
    lines = [line for lang in ("en", "de")
             for line in (SHARED_DATA / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:300]]
    (tmp_path / "spm.model").write_bytes(spm.train(lines, 300, num_threads=1))
    stage = tmp_path / "teacher"
    for direction in ("src2tgt", "tgt2src"):
        model = Transformer(TransformerConfig(vocab_size=300, d_model=32, n_heads=2, ffn_dim=64, encoder_layers=1,
                                              decoder_layers=1, dropout=0.0))
        save_model_dir(stage / direction, model, tmp_path / "spm.model", "en", "de", extra={"direction": direction})
    (stage / teacher.TEACHERS_FILE).write_text(json.dumps({d: d for d in ("src2tgt", "tgt2src")}), encoding="utf-8")
    common = ["--teachers", str(stage), "--sentences", "30", "--max-tokens", "256", "--repeats", "2"]
    split = beam_search.main(common + ["--out", str(tmp_path / "split.json")])
    whole = beam_search.main(common + ["--no-split"])
    assert split["decodes"] == whole["decodes"] == 60 and split["mean_output_pieces"] > 0
    assert split["outputs_sha256"] == whole["outputs_sha256"]
    assert split["tolist_calls"] == whole["tolist_calls"] > 0 and split["item_calls"] == whole["item_calls"]
    assert 0 < split["network_s"] < split["wall_s"]
    assert split["search_s"] == pytest.approx(split["wall_s"] - split["network_s"], abs=0.0011)  # each rounded to ms
    assert whole["network_s"] is None and json.loads((tmp_path / "split.json").read_text()) == split
