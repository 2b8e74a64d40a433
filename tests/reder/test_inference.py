"""reder/inference.py: the inference trunk against the reference path (`fast_inference = False`), token by token."""
import pytest
import torch

from reder.inference import quantized, run_inference
from tests.reder.helpers import padding_mask, random_batch, tiny_model

LENGTHS = [7, 3, 5, 1, 6, 2]  # ragged (padding in every layer's attention), and a 1-token input


def _model(head: str = "ctc", **overrides):
    extra = {"head": head, "graph_upsample_ratio": 2.0} if head == "dag" else {}
    model = tiny_model(vocab_size=20, d_model=16, n_heads=2, ffn_dim=24, layers_per_end=2, **extra, **overrides)
    for norm in model.actnorm.values():  # a random, non-identity ActNorm: the inverse is in the path too
        norm.log_scale.data.normal_(0, 0.3)
        norm.bias.data.normal_(0, 0.3)
        norm.initialized.fill_(True)
    return model.eval()


def _both(model, call):
    model.fast_inference = False
    reference = call()
    model.fast_inference = True
    return reference, call()


@pytest.mark.parametrize("share_ends", [False, True])
def test_trunk_matches_the_reference_at_real_positions(share_ends):
    model = _model(share_ends=share_ends)
    h, mask = torch.randn(len(LENGTHS), max(LENGTHS), 2 * 16), padding_mask(LENGTHS)
    for direction in ("src2tgt", "tgt2src"):
        with torch.inference_mode():
            reference, fast = _both(model, lambda: model.layers(h, mask, direction))
        torch.testing.assert_close(fast[mask], reference[mask], rtol=1e-5, atol=1e-5)
        assert not fast[~mask].any()  # padded positions are zero, not computed
        back = run_inference(fast, mask, model.ops("tgt2src" if direction == "src2tgt" else "src2tgt"))
        torch.testing.assert_close(back[mask], h[mask], rtol=1e-4, atol=1e-4)  # still the inverse map


@pytest.mark.parametrize("head", ["ctc", "dag"])
def test_translations_equal_the_reference_path(head):
    """Every decoder, ragged batches and one sentence at a time: the same tokens through both paths."""
    model = _model(head)
    tokens, lengths = random_batch(LENGTHS, 20)
    runs = [dict(beam_size=1), dict(beam_size=4)] + ([dict(decoder="lookahead"), dict(decoder="viterbi")] if head == "dag" else [])
    for direction in ("src2tgt", "tgt2src"):
        for options in runs:
            reference, fast = _both(model, lambda: model.translate(tokens, lengths, direction, **options))
            assert fast == reference, (direction, options)
            for row, length in enumerate(LENGTHS):  # batch 1: no padding at all
                one = tokens[row : row + 1, :length], lengths[row : row + 1]
                assert model.translate(*one, direction, **options) == reference[row:row + 1]
        with torch.inference_mode():
            reference, fast = _both(model, lambda: model.outputs(tokens, lengths, direction))
        valid = padding_mask(reference.lengths.tolist())
        torch.testing.assert_close(fast.log_probs[valid], reference.log_probs[valid], rtol=1e-5, atol=1e-5)


def test_training_and_gradients_take_the_reference_path():
    """With gradients on, or in training mode, `layers` is the reversible trunk whatever `fast_inference` says."""
    model = _model()
    h, mask = torch.randn(2, 4, 32), padding_mask([4, 2])
    with torch.no_grad():
        model.train()
        model.fast_inference = True
        assert model.layers(h, mask, "src2tgt")[~mask].any()  # padded positions computed: the reference path
    model.eval()
    assert model.layers(h, mask, "src2tgt").requires_grad


def test_int8_quantizes_the_trunk_linears_and_decodes():
    model = _model()
    int8 = quantized(model)
    linears = [m for m in int8.ends.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears and int8.fast_inference and model.ends["src"][0].feed_forward.inner.weight.dtype == torch.float32
    tokens, lengths = random_batch(LENGTHS, 20)
    with torch.inference_mode():
        reference, fast = model.outputs(tokens, lengths, "src2tgt"), int8.outputs(tokens, lengths, "src2tgt")
    valid = padding_mask(reference.lengths.tolist())
    assert (fast.log_probs[valid] - reference.log_probs[valid]).abs().max() < 0.5  # int8 weights: close, not equal
    assert len(int8.translate(tokens, lengths, "src2tgt")) == len(LENGTHS)
