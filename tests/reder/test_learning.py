"""The model learns: a small REDER memorises 64 real Multi30k pairs in both directions."""
import pytest

from reder import LossConfig, ModelConfig, REDER
from tests.reder.helpers import MULTI30K, WordPairs, memorise

TIME_LIMIT_S = 180
AUX_START = 25  # stage two: the auxiliary losses join after the model has started to fit


@pytest.mark.slow
@pytest.mark.timed
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent")
def test_overfits_64_multi30k_pairs_in_both_directions():
    data = WordPairs()
    cfg = ModelConfig(vocab_size=data.vocab_size, d_model=128, n_heads=4, ffn_dim=256, layers_per_end=2,
                      dropout=0.0, upsample_ratio=3, max_relative_distance=8, label_smoothing=0.0)
    model = REDER(cfg).train()
    loss_config = LossConfig(lambda_fba=0.1, lambda_cc=0.1, aux_start_step=AUX_START)
    terms, bleu = memorise(model, loss_config, data, every=5, score_from=AUX_START + 10, limit_s=TIME_LIMIT_S)
    scores = {d: bleu(d) for d in ("src2tgt", "tgt2src")}
    assert terms["fba_src2tgt"] > 0 and terms["cc_tgt2src"] > 0  # the auxiliary stage ran
    assert min(scores.values()) > 90, scores
