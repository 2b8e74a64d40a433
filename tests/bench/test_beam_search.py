"""bench.beam_search on tiny random teachers laid out as a teacher stage does: timing the network calls leaves
the search's outputs as they are, the split adds up, and the steps and batches are the search's."""
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
    common = ["--teachers", str(stage), "--sentences", "30", "--repeats", "2"]
    report = beam_search.main(common + ["--max-tokens", "128", "100000", "--out", str(tmp_path / "split.json")])
    whole = beam_search.main(common + ["--max-tokens", "128", "--no-split"])
    assert report["decodes"] == whole["decodes"] == 60 and report["mean_output_pieces"] > 0
    assert report["outputs_sha256"] == whole["outputs_sha256"]  # the same outputs, timed or not, whatever the batch
    # a step: the decoder's layer (attention, cross-attention, feed-forward, norms) and the search's ranking
    assert 40 < report["aten_ops_per_step"] == whole["aten_ops_per_step"] < 1000
    split, one_batch = report["runs"]
    assert (split["max_tokens"], one_batch["max_tokens"]) == (128, 100000)
    assert split["tolist_calls"] == whole["runs"][0]["tolist_calls"] > 0
    assert split["item_calls"] == whole["runs"][0]["item_calls"]
    assert 0 < split["network_s"] < split["wall_s"]
    assert split["search_s"] == pytest.approx(split["wall_s"] - split["network_s"], abs=0.0011)  # each rounded to ms
    assert whole["runs"][0]["network_s"] is None and json.loads((tmp_path / "split.json").read_text()) == report
    # one search per planned batch and direction; a step advances every live sentence of its batch, so one batch
    # of all 30 takes fewer steps than many small ones, and at least the 10 pieces every limit allows (1.2·|x| + 10)
    # unless a sentence ends sooner
    assert one_batch["batches"] == 2 and split["batches"] > 2 and split["batches"] == whole["runs"][0]["batches"]
    assert split["decoder_steps"] > one_batch["decoder_steps"] >= 2 * 10
    # as the evaluate stage batches: length-sorted batches of so many sentences, on another subset
    by_sentences = beam_search.main(common + ["--no-split", "--subset", "test_2016_flickr", "--max-tokens", "0",
                                              "--batch-size", "7", "--beam", "1"])
    assert by_sentences["subset"] == "test_2016_flickr" and by_sentences["decodes"] == 60
    assert by_sentences["runs"][0]["batch_size"] == 7 and by_sentences["runs"][0]["batches"] == 2 * 5  # 30 = 4·7 + 2
