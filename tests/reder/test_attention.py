"""Relative self-attention: against a per-element reference, and the distance limit (model.max_relative_distance)
end to end: a larger limit changes the scores only of pairs farther apart than the smaller one."""
import math

import pytest
import torch

from pipeline.config import load_config
from reder import REDER
from reder.attention import RelativeSelfAttention
from tests.reder.helpers import padding_mask


def _reference(attention: RelativeSelfAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The textbook formula, one score at a time: (q_i·k_j + q_i·r_clip(j−i)) / √dh over the real keys."""
    batch, length, d_model = x.shape
    heads, dh, limit = attention.n_heads, attention.d_head, attention.max_relative_distance
    q, k, v = attention.qkv(x).view(batch, length, 3, heads, dh).unbind(2)  # 3×(B, T, H, dh)
    table = attention.relative_keys.weight
    context = torch.zeros(batch, length, heads, dh, dtype=x.dtype)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                scores = torch.full((length,), -math.inf, dtype=x.dtype)
                for j in range(length):
                    if mask[b, j]:
                        r = table[max(-limit, min(limit, j - i)) + limit]
                        scores[j] = (q[b, i, h] @ k[b, j, h] + q[b, i, h] @ r) / math.sqrt(dh)
                context[b, i, h] = torch.softmax(scores, 0) @ v[b, :, h]
    return attention.out(context.reshape(batch, length, d_model))


@pytest.mark.parametrize("limit", [1, 3, 6, 50])  # below, at and beyond the longest distance (5)
def test_attention_matches_the_per_element_formula(limit):
    attention = RelativeSelfAttention(8, 2, limit, 0.0).double().eval()
    x, mask = torch.randn(2, 6, 8, dtype=torch.float64), padding_mask([6, 4])
    expected = _reference(attention, x, mask)
    assert torch.allclose(attention(x, mask)[mask], expected[mask], atol=1e-10)


def _scores(attention: RelativeSelfAttention, x: torch.Tensor, mask: torch.Tensor, monkeypatch) -> torch.Tensor:
    """The relative bias q_i·r_clip(j−i)/√dh the module hands to scaled_dot_product_attention (B, H, T, T)."""
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr("reder.attention.F.scaled_dot_product_attention", spy)
    attention(x, mask)
    monkeypatch.undo()
    return seen[0]


def test_a_larger_limit_changes_only_the_scores_beyond_the_smaller_one(monkeypatch):
    """Limit 4 vs 8 with the same weights and the same table rows for distances up to ±4: scores of pairs at
    most 4 apart are equal, every score of a pair farther apart differs; with the rows beyond ±4 copies of
    the edge rows (what clipping reads), the larger limit is the same attention."""
    small = RelativeSelfAttention(8, 2, 4, 0.0).double().eval()
    large = RelativeSelfAttention(8, 2, 8, 0.0).double().eval()
    large.qkv.load_state_dict(small.qkv.state_dict())
    large.out.load_state_dict(small.out.state_dict())
    with torch.no_grad():
        large.relative_keys.weight[4:13] = small.relative_keys.weight  # distances −4..4
    x, mask = torch.randn(1, 12, 8, dtype=torch.float64), padding_mask([12])
    distance = (torch.arange(12)[None, :] - torch.arange(12)[:, None]).abs()
    near, far = distance <= 4, distance > 4
    bias_small, bias_large = _scores(small, x, mask, monkeypatch), _scores(large, x, mask, monkeypatch)
    assert torch.allclose(bias_small[..., near], bias_large[..., near], rtol=0, atol=1e-12)
    assert ((bias_small[..., far] - bias_large[..., far]).abs() > 1e-6).all()
    with torch.no_grad():  # the rows beyond ±4 as clipping reads them: the edge rows
        large.relative_keys.weight[:4] = small.relative_keys.weight[0]
        large.relative_keys.weight[13:] = small.relative_keys.weight[-1]
    assert torch.allclose(large(x, mask), small(x, mask), atol=1e-12)


def test_the_limit_reaches_every_layer_from_the_pipeline_config():
    """model.max_relative_distance from a pipeline override to every attention layer of both ends."""
    tiny = ["model.d_model=16", "model.n_heads=2", "model.ffn_dim=16", "model.layers_per_end=2", "model.vocab_size=64"]
    for limit in (16, 1024):  # the default, and the official code's (effectively unclipped)
        cfg = load_config(None, [*tiny, f"model.max_relative_distance={limit}"])
        model = REDER(cfg.model)
        layers = [m for m in model.modules() if isinstance(m, RelativeSelfAttention)]
        assert len(layers) == 4
        assert all(a.max_relative_distance == limit and a.relative_keys.num_embeddings == 2 * limit + 1 for a in layers)
    assert load_config(None, []).model.max_relative_distance == 16


@pytest.mark.gpu
def test_cuda_attention_runs_without_cudnns_kernel(monkeypatch):
    """On CUDA, `sdpa` keeps PyTorch from cuDNN's fused attention (an execution plan per new shape: on an H200 the
    teachers' first 50 updates took 101 s with it, docs/results/pipeline_gpu.md), and the result equals the default's."""
    from reder import attention

    real, seen = attention.F.scaled_dot_product_attention, []

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    q, k, v = torch.randn(3, 2, 4, 7, 16, device="cuda").unbind(0)
    mask = torch.rand(2, 1, 7, 7, device="cuda") > 0.3
    mask[..., 0] = True  # every query sees a key
    out = attention.sdpa(q, k, v, attn_mask=mask)
    assert seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()  # off for the call only
    torch.testing.assert_close(out, real(q, k, v, attn_mask=mask), rtol=1e-4, atol=1e-4)
