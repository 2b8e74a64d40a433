"""bench.quality's aux phase (the auxiliary losses' paired ablation) end to end on a slice of Multi30k, and its
paired bootstrap against sacreBLEU's own scores."""
import json

import pytest
import sacrebleu

from bench import quality
from tests.bench.conftest import TINY


def test_paired_bootstrap_matches_sacrebleu_and_finds_a_real_difference(multi30k_slice):
    english, german = quality._lines(multi30k_slice, quality.TESTS[0])
    references = {"src2tgt": german, "tgt2src": english}
    worse = {f"{split}.{d}": [" ".join(line.split()[::2]) for line in quality._lines(multi30k_slice, split)[d == "src2tgt"]]
             for split in quality.TESTS for d in ("src2tgt", "tgt2src")}
    perfect = {f"{split}.{d}": quality._lines(multi30k_slice, split)[d == "src2tgt"]
               for split in quality.TESTS for d in ("src2tgt", "tgt2src")}
    result = quality._paired_bootstrap(worse, perfect, multi30k_slice, samples=200)
    assert set(result) == set(worse)
    cell = result[f"{quality.TESTS[0]}.src2tgt"]
    expected = sacrebleu.corpus_bleu(worse[f"{quality.TESTS[0]}.src2tgt"], [references["src2tgt"]]).score
    assert cell["baseline"] == pytest.approx(expected, abs=0.01) and cell["system"] == 100.0
    assert cell["delta"] == pytest.approx(100.0 - expected, abs=0.02) and cell["p_value"] < 0.05


@pytest.mark.slow
def test_aux_phase_forks_one_first_stage_into_continuations_with_each_term_set(multi30k_slice, tmp_path, capsys):
    # configs/multi30k.yaml has stage two off: the aux phase measures the paper's weights
    common = ["--data-dir", str(multi30k_slice), "--max-tokens", "600", "--warmup", "1", *TINY,
              "loss.lambda_fba=0.1", "loss.lambda_cc=0.1"]
    quality.main(["teachers", "--out", str(tmp_path / "T"), "--steps", "2", *common])
    report = quality.main(["aux", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "A"), "--steps", "4",
                           "--aux-from", "0.5", "--aux-terms", "both", "cc", "--seeds", "1", "2", *common])
    assert json.loads((tmp_path / "A" / "aux.json").read_text(encoding="utf-8")) == report
    assert report["phase"] == "aux" and report["fork_update"] == 2 and report["teachers_loaded"]
    assert report["stage1"]["train"]["steps"] == 2
    assert not any(key.startswith(("kd_fba", "paired_bootstrap_greedy_fba", "over_seeds_greedy_fba")) for key in report)
    for seed in (1, 2):
        noaux = report[f"kd_noaux_seed{seed}"]
        for name, bootstrap in (("kd", "paired_bootstrap_greedy"), ("kd_cc", "paired_bootstrap_greedy_cc")):
            system = report[f"{name}_seed{seed}"]
            assert system["train"]["steps"] == noaux["train"]["steps"] == 2
            # same weights, same batches, same dropout seed: only the auxiliary terms make the losses differ
            assert system["train"]["last_loss"] > noaux["train"]["last_loss"]
            for cell, test in report[f"{bootstrap}_seed{seed}"].items():
                assert test["system"] == system["greedy"][cell]["bleu"]
                assert test["baseline"] == noaux["greedy"][cell]["bleu"]
        # CC alone is a part of FBA + CC: the pair's loss has it and more (FBA's term is > 0)
        assert report[f"kd_seed{seed}"]["train"]["last_loss"] > report[f"kd_cc_seed{seed}"]["train"]["last_loss"]
    # seed 2 continues the same first stage on other batches, with other dropout
    assert report["kd_noaux_seed2"]["train"]["last_loss"] != report["kd_noaux_seed1"]["train"]["last_loss"]
    for over, bootstrap in (("over_seeds_greedy", "paired_bootstrap_greedy"), ("over_seeds_greedy_cc", "paired_bootstrap_greedy_cc")):
        for cell, summary in report[over].items():
            deltas = [report[f"{bootstrap}_seed{seed}"][cell]["delta"] for seed in (1, 2)]
            assert summary["mean_delta"] == round(sum(deltas) / 2, 2)
            assert (summary["min_delta"], summary["max_delta"]) == (min(deltas), max(deltas))
    assert "greedy_latency_ms" in report["kd_seed1"]["speed"] and "teacher_beam4_latency_ms" in report["kd_seed1"]["speed"]
    with pytest.raises(ValueError, match="strictly inside"):
        quality.main(["aux", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "B"), "--steps", "4",
                      "--aux-from", "1.0", *common])
    with pytest.raises(ValueError, match=r"--aux-terms fba with loss\.lambda_fba 0\.0 .* no auxiliary term"):
        quality.main(["aux", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "B"), "--steps", "4",
                      "--aux-from", "0.5", "--aux-terms", "fba", *common, "loss.lambda_fba=0"])
