"""bench.int8_quality --model: a saved model directory scored float32 and int8 on held-out pairs, both ways."""
from bench import int8_quality


def test_a_model_directory_is_scored_float32_and_int8_both_ways(tiny_model_dir, tmp_path):
    (tmp_path / "held.en").write_text("the cat sat on the mat\na dog ran in the park\n", encoding="utf-8")
    (tmp_path / "held.de").write_text("die katze sass\nein hund lief\n", encoding="utf-8")
    report = int8_quality.main(["--model", str(tiny_model_dir), "--test", str(tmp_path / "held"), "--repeats", "1",
                                "--out", str(tmp_path / "out.json")])
    assert report["sentences"] == 2 and set(report["directions"]) == {"src2tgt", "tgt2src"}
    for scores in report["directions"].values():
        assert {"bleu_float32", "bleu_int8"} <= set(scores) and 0 <= scores["identical_share"] <= 1
    assert set(report["sentences_per_s_batch64"]) == {"float32", "int8"}
    assert (tmp_path / "out.json").is_file()
