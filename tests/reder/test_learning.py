"""The model learns: a small REDER memorises 64 real Multi30k pairs in both directions."""
import time

import pytest
import sacrebleu
import torch

from reder import LossConfig, ModelConfig, REDER
from tests.reder.helpers import MULTI30K, WordPairs

TIME_LIMIT_S = 180
AUX_START = 60  # stage two: the auxiliary losses join after the model has started to fit


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent")
def test_overfits_64_multi30k_pairs_in_both_directions():
    data = WordPairs()
    cfg = ModelConfig(vocab_size=data.vocab_size, d_model=128, n_heads=4, ffn_dim=256, layers_per_end=2,
                      dropout=0.0, upsample_ratio=3, max_relative_distance=8, label_smoothing=0.0)
    model = REDER(cfg, LossConfig(lambda_fba=0.1, lambda_cc=0.1, aux_start_step=AUX_START)).train()
    src, src_lengths = data.encode(data.english)
    tgt, tgt_lengths = data.encode(data.german)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))

    def bleu(direction: str) -> float:
        model.eval()
        tokens, lengths, references = (src, src_lengths, data.german) if direction == "src2tgt" else (tgt, tgt_lengths, data.english)
        hypotheses = [data.decode(h) for h in model.translate(tokens, lengths, direction)]
        model.train()
        return sacrebleu.corpus_bleu(hypotheses, [references]).score

    start, step, scores = time.monotonic(), 0, {}
    while time.monotonic() - start < TIME_LIMIT_S:
        terms = model.loss(src, src_lengths, tgt, tgt_lengths, step)
        optimizer.zero_grad()
        terms["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 30 == 0:
            scores = {d: bleu(d) for d in ("src2tgt", "tgt2src")}
            print(step, f"{time.monotonic() - start:.0f}s", {k: round(v.item(), 3) for k, v in terms.items()}, scores)
            if min(scores.values()) > 90 and step >= AUX_START + 30:
                break
    assert terms["fba_src2tgt"] > 0 and terms["cc_tgt2src"] > 0  # the auxiliary stage ran
    assert min(scores.values()) > 90, scores
