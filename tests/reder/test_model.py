import pytest
import torch

from reder import EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER
from reder.decoding.run import decode
from tests.reder.helpers import random_batch, tiny_config, tiny_model


def test_forward_shapes_and_log_probabilities():
    model = tiny_model(upsample_ratio=3).eval()
    tokens, lengths = random_batch([5, 2], 12)
    log_probs, out_lengths = model(tokens, lengths, "src2tgt")
    assert log_probs.shape == (2, 15, 12) and log_probs.dtype == torch.float32
    assert out_lengths.tolist() == [15, 6]
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 15), atol=1e-5)


def test_decode_returns_lists_without_specials_in_both_directions():
    model = tiny_model().eval()
    tokens, lengths = random_batch([5, 3, 1], 12)
    for direction in ("src2tgt", "tgt2src"):
        for decoder, options in (("greedy", {}), ("beam", {"beam_size": 4})):
            hypotheses = decode(model, tokens, lengths, direction, decoder, **options)
            assert len(hypotheses) == 3
            assert all(isinstance(t, int) and 4 <= t < 11 or t == 1 for h in hypotheses for t in h)
            assert all(EOS_ID not in h for h in hypotheses)


def test_greedy_from_logits_equals_greedy_from_log_probs_at_every_batch_size():
    """The fast path (CTC greedy on the logits, under inference mode) gives the hypotheses of the normalised
    path (`ctc_greedy` over log-softmax outputs), in a batch of 48 ragged sentences and one at a time."""
    from reder.decode import ctc_greedy, strip_special

    torch.manual_seed(3)
    model = tiny_model(vocab_size=40).eval()
    tokens, lengths = random_batch([int(n) for n in torch.randint(1, 12, (48,))], 40)
    for direction in ("src2tgt", "tgt2src"):
        with torch.no_grad():
            output = model.outputs(tokens, lengths, direction)
        reference = [strip_special(h, model.cfg.blank_id) for h in ctc_greedy(output.log_probs, output.lengths, model.cfg.blank_id)]
        assert decode(model, tokens, lengths, direction) == reference
        assert [decode(model, tokens[i : i + 1, : int(lengths[i])], lengths[i : i + 1], direction)[0]
                for i in range(48)] == reference
        assert len({tuple(h) for h in reference}) > 10  # varied outputs, not one repeated hypothesis


def test_bad_direction_and_too_long_input_are_clear_errors():
    model = tiny_model(max_positions=8).eval()
    tokens, lengths = random_batch([5], 12)
    with pytest.raises(ValueError, match="direction"):
        model(tokens, lengths, "en2de")
    with pytest.raises(ValueError, match="max_positions"):
        model(tokens, lengths, "src2tgt")


def test_share_ends_ties_the_layers():
    shared, separate = tiny_model(share_ends=True), tiny_model(share_ends=False)
    assert shared.ends["src"] is shared.ends["tgt"]
    n_layer = sum(p.numel() for p in separate.ends["src"].parameters())
    assert sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in shared.parameters()) == n_layer


def test_config_validation_and_round_trip():
    cfg = tiny_config()
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg and cfg.blank_id == 11
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict({**cfg.to_dict(), "d_modle": 3})
    with pytest.raises(ValueError, match=r"^n_heads: must be a positive divisor of d_model \(\d+\), got 3$"):
        tiny_config(n_heads=3)
    with pytest.raises(ValueError, match=r"^upsample_ratio: must be an int >= 1, got 0$"):
        tiny_config(upsample_ratio=0)
    with pytest.raises(ValueError, match=r"^lambda_fba: must be >= 0, got -1$"):
        LossConfig(lambda_fba=-1)


def test_state_dict_round_trip_keeps_actnorm_initialisation():
    model = tiny_model().train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    DuplexLoss(model)(src, src_lengths, tgt, tgt_lengths, step=0)
    assert all(bool(model.actnorm[end].initialized) for end in ("src", "tgt"))
    restored = REDER(model.cfg)
    restored.load_state_dict(model.state_dict())
    model.eval(), restored.eval()
    assert torch.equal(model(src, src_lengths, "src2tgt")[0], restored(src, src_lengths, "src2tgt")[0])
