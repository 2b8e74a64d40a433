"""reder/runtime/onednn.py: the inference trunk against the reference path (`fast_inference = False`), token by token."""
import itertools

import pytest
import torch

import reder.runtime.onednn
from reder.decoding import decoder_names
from reder.decoding.run import decode
from reder.runtime.onednn import AttentionPlan, length_groups, quantized, run_inference
from tests.reder.helpers import decoding_model as _model
from tests.reder.helpers import padding_mask, random_batch

LENGTHS = [7, 3, 5, 1, 6, 2]  # ragged (padding in every layer's attention), and a 1-token input


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
    runs = [(name, {"beam_size": 4} if name == "beam" else {}) for name in decoder_names(head)]
    assert {"greedy", "beam"} <= {name for name, _ in runs}
    for direction in ("src2tgt", "tgt2src"):
        for decoder, options in runs:
            reference, fast = _both(model, lambda: decode(model, tokens, lengths, direction, decoder, **options))
            assert fast == reference, (direction, decoder)
            for row, length in enumerate(LENGTHS):  # batch 1: no padding at all
                one = tokens[row : row + 1, :length], lengths[row : row + 1]
                assert decode(model, *one, direction, decoder, **options) == reference[row:row + 1]
        with torch.inference_mode():
            reference, fast = _both(model, lambda: model.outputs(tokens, lengths, direction))
        valid = padding_mask(reference.lengths.tolist())
        torch.testing.assert_close(fast.log_probs[valid], reference.log_probs[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group_cost", [0, 3])
def test_length_groups_equal_the_reference_path(monkeypatch, group_cost):
    """The attention in length groups (cost 0: one group per distinct length; the batch unsorted, so the groups
    permute the packed positions): the same states and tokens as the reference path, and as one padded group."""
    monkeypatch.setattr(reder.runtime.onednn, "GROUP_COST", group_cost)
    model = _model()
    mask = padding_mask(LENGTHS)
    plan = AttentionPlan.build(mask, 2, 4)
    assert len(plan.groups) > 1 and plan.order is not None
    assert [g.batch for g in plan.groups] == [len(r) for r in length_groups(sorted(LENGTHS), group_cost)]
    tokens, lengths = random_batch(LENGTHS, 20)
    h = torch.randn(len(LENGTHS), max(LENGTHS), 2 * 16)
    for direction in ("src2tgt", "tgt2src"):
        for decoder, options in (("greedy", {}), ("beam", {"beam_size": 4})):
            reference, fast = _both(model, lambda: decode(model, tokens, lengths, direction, decoder, **options))
            assert fast == reference, (direction, decoder)
        with torch.inference_mode():
            reference, grouped = _both(model, lambda: model.layers(h, mask, direction))
            monkeypatch.setattr(reder.runtime.onednn, "GROUP_COST", 10**9)
            one_group = model.layers(h, mask, direction)
            monkeypatch.setattr(reder.runtime.onednn, "GROUP_COST", group_cost)
        torch.testing.assert_close(grouped[mask], reference[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grouped, one_group, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lengths", [[1], [3, 3, 3], [1, 2, 2, 5, 9, 9, 10, 30], list(range(2, 40, 3))])
@pytest.mark.parametrize("cost", [0, 4, 16, 1000])
def test_length_groups_are_the_cheapest_split(lengths, cost):
    """Against brute force over every split of the distinct lengths into runs: each run costs its sentences ×
    its longest, plus `cost`."""
    runs = length_groups(lengths, cost)
    assert [i for run in runs for i in run] == list(range(len(lengths)))
    distinct = sorted(set(lengths))

    def price(cuts):
        bounds = [0, *cuts, len(distinct)]
        return sum(sum(1 for x in lengths if distinct[a] <= x <= distinct[b - 1]) * distinct[b - 1] + cost
                   for a, b in zip(bounds, bounds[1:]))

    best = min(price(cuts) for k in range(len(distinct)) for cuts in itertools.combinations(range(1, len(distinct)), k))
    assert sum(len(run) * lengths[run[-1]] + cost for run in runs) == best


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
    assert len(decode(int8, tokens, lengths, "src2tgt")) == len(LENGTHS)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a torch build with oneDNN")


@needs_onednn
def test_the_onednn_kernels_equal_torchs_linear_and_projection():
    """`linear` (GELU fused or not) and `tied_logits` through prepacked oneDNN weights: torch's float32 results, to
    float32 rounding; with gradients on they are torch's own ops."""
    layer = torch.nn.Linear(48, 40)
    with torch.no_grad():
        for rows in (7, 17, 100):  # at its own size, and padded to its bucket (18, 104 rows)
            x = torch.randn(rows, 48)
            assert reder.runtime.onednn.onednn(x)
            torch.testing.assert_close(reder.runtime.onednn.linear(layer, x), layer(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(reder.runtime.onednn.linear(layer, x, gelu=True),
                                       torch.nn.functional.gelu(layer(x)), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(reder.runtime.onednn.tied_logits(x, layer.weight), x @ layer.weight.t(),
                                       rtol=1e-5, atol=1e-5)
    assert not reder.runtime.onednn.onednn(x)  # gradients on: autograd's ops, never the prepacked kernel
    assert reder.runtime.onednn.linear(layer, x).requires_grad


@needs_onednn
def test_the_fast_path_runs_its_matmuls_on_prepacked_onednn_weights():
    """At batch 1 and in a ragged batch, every trunk linear layer and the output projection go through oneDNN's
    kernel on CPU (none through addmm), and the tokens stay the reference path's."""
    from torch.profiler import ProfilerActivity, profile

    model = _model()
    tokens, lengths = random_batch(LENGTHS, 20)
    for batch in ((tokens, lengths), (tokens[:1, : LENGTHS[0]], lengths[:1])):
        reference, _ = _both(model, lambda: decode(model, *batch, "src2tgt"))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            assert decode(model, *batch, "src2tgt") == reference
        counts = {event.key: event.count for event in prof.key_averages()}
        linears = sum(isinstance(m, torch.nn.Linear) for m in model.ends.modules())  # both ends' layers run
        assert counts.get("mkldnn::_linear_pointwise") == linears + 1 and "aten::addmm" not in counts, counts


@needs_onednn
def test_a_prepacked_weight_follows_its_weight():
    """The reordered copy is rebuilt when its weight changes: in place (load_state_dict, an optimiser step) or by
    another storage (`.data =`), so decoding never uses stale weights."""
    model, other = _model(), _model()
    other.load_state_dict({k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
                           for k, v in other.state_dict().items()})
    tokens, lengths = random_batch(LENGTHS, 20)
    with torch.inference_mode():
        before = model.outputs(tokens, lengths, "src2tgt")  # builds the packed weights
    model.load_state_dict(other.state_dict())  # in place: the same parameters, new values
    with torch.inference_mode():
        reference, fast = _both(model, lambda: model.outputs(tokens, lengths, "src2tgt"))
    valid = padding_mask(reference.lengths.tolist())  # the fast path leaves padded positions' logits at zero
    assert not torch.allclose(before.log_probs[valid], fast.log_probs[valid])
    torch.testing.assert_close(fast.log_probs[valid], reference.log_probs[valid], rtol=1e-5, atol=1e-5)
    layer = model.ends["src"][0].feed_forward.inner
    layer.weight.data = torch.zeros_like(layer.weight)  # another storage
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        torch.testing.assert_close(reder.runtime.onednn.linear(layer, x), layer.bias.expand(3, -1))


@needs_onednn
def test_a_prepacked_weight_made_under_inference_mode_follows_an_in_place_update():
    """A model built under inference mode has weights without a version counter; updated in place under inference
    mode after a decode packed them (load_state_dict, as a server reloading its weights; one weight scaled), the next
    call uses the new values: the reference path's outputs, torch's linear."""
    other = _model()
    other.load_state_dict({k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
                           for k, v in other.state_dict().items()})
    tokens, lengths = random_batch(LENGTHS, 20)
    with torch.inference_mode():
        model = _model()
        assert model.ends["src"][0].feed_forward.inner.weight.is_inference()
        before = model.outputs(tokens, lengths, "src2tgt")  # builds the packed weights
        model.load_state_dict(other.state_dict())  # in place: the same tensors, new values
        reference, fast = _both(model, lambda: model.outputs(tokens, lengths, "src2tgt"))
        layer, x = model.ends["src"][0].feed_forward.inner, torch.randn(3, 16)
        reder.runtime.onednn.linear(layer, x)  # packs the weight
        layer.weight.mul_(2.0)
        torch.testing.assert_close(reder.runtime.onednn.linear(layer, x), torch.nn.functional.linear(x, layer.weight,
                                                                                                 layer.bias))
    valid = padding_mask(reference.lengths.tolist())  # the fast path leaves padded positions' logits at zero
    assert not torch.allclose(before.log_probs[valid], fast.log_probs[valid])
    torch.testing.assert_close(fast.log_probs[valid], reference.log_probs[valid], rtol=1e-5, atol=1e-5)


def test_row_counts_are_bucketed_so_that_a_server_meets_few_matmul_shapes(monkeypatch):
    """oneDNN keeps a primitive per matmul shape (up to 1,024, a few hundred KB each): decoding batches of every
    size, the trunk's and projection's matmuls meet a few dozen row counts, not one per batch; each bucket at most
    1/8 above its rows (16 rows and fewer exactly)."""
    bucket = reder.runtime.onednn.bucket
    sizes = [bucket(rows) for rows in range(1, 8193)]
    assert sizes[:16] == list(range(1, 17)) and sizes == sorted(sizes)
    assert all(rows <= size <= rows * 9 / 8 for rows, size in zip(range(1, 8193), sizes))
    assert len(set(sizes)) == 16 + 8 * 9  # eight a doubling from 17 to 8,192

    seen: set[int] = set()
    original = reder.runtime.onednn.bucketed
    monkeypatch.setattr(reder.runtime.onednn, "bucketed",
                        lambda matmul, x: original(lambda rows: (seen.add(rows.shape[0]), matmul(rows))[1], x))
    model, counts = _model(), set()
    torch.manual_seed(0)
    with torch.inference_mode():
        for size in range(1, 151):  # batches of 1 to 150 sentences of 2 to 12 tokens
            lengths = torch.randint(2, 13, (size,)).tolist()
            counts.add(sum(lengths))
            decode(model, *random_batch(lengths, 20), "src2tgt")
    assert len(counts) > 140 and len(seen) <= 60, (len(counts), sorted(seen))
