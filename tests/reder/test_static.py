"""reder/runtime/compiled.py: the trunk at bucketed static shapes under torch.compile, against the eager inference path."""
import pytest
import torch

from reder.runtime.onednn import run_inference
from reder.runtime.compiled import LENGTHS, StaticTrunk, bucket, compiled, pad_to_bucket
from reder.decoding.run import translate_ids
from tests.reder.helpers import decoding_model, padding_mask, random_batch

# Upsampled (r = 2) to 6, 18, 28 and 60 positions: the buckets 8, 24, 32 and 64, alone or together
LENGTHS_ACROSS_BUCKETS = [3, 14, 9, 30]


def test_bucket_is_the_smallest_that_holds():
    assert [bucket(n, LENGTHS) for n in (1, 8, 9, 33, 512, 513, 1100)] == [8, 8, 16, 48, 512, 1024, 1536]
    h, mask = torch.randn(3, 10, 4), padding_mask([10, 4, 7])
    padded, padded_mask = pad_to_bucket(h, mask)
    assert padded.shape == (4, 16, 4) and padded_mask.shape == (4, 16)
    assert torch.equal(padded[:3, :10], h) and not padded[3:].any() and not padded[:, 10:].any()
    assert torch.equal(padded_mask[:3, :10], mask) and padded_mask[3].tolist() == [True] + [False] * 15


def _sequences(lengths: list[int]) -> list[list[int]]:
    tokens, _ = random_batch(lengths, 20)
    return [row[:length].tolist() for row, length in zip(tokens, lengths)]


def _decode(model, sequences: list[list[int]], direction: str, beam: int, batch_size: int) -> list[list[int]]:
    """CTC greedy (beam 1) or the CTC beam of size `beam`, in batches of `batch_size`."""
    if beam == 1:
        return translate_ids(model, sequences, direction, "greedy", batch_size)
    return translate_ids(model, sequences, direction, "beam", batch_size, beam_size=beam)


def _check_equal_tokens(model, sequences: list[list[int]], directions: tuple[str, ...] = ("src2tgt", "tgt2src"),
                        sizes: tuple[int, ...] = (1, 3, 4)) -> None:
    """The static trunk's tokens equal the eager trunk's, CTC greedy and beam, at each batch size of `sizes`:
    1 (each length its own bucket), 3 (a batch bucket of 4: one added sentence), 4 (all at once)."""
    static_trunk, model.static_trunk = model.static_trunk, None
    runs = [(direction, beam, size) for direction in directions for beam in (1, 3) for size in sizes]
    eager = [_decode(model, sequences, direction, beam, size) for direction, beam, size in runs]
    model.static_trunk = static_trunk
    for (direction, beam, size), expected in zip(runs, eager):
        assert _decode(model, sequences, direction, beam, size) == expected, (direction, beam, size)


def test_static_shapes_equal_the_eager_trunk():
    """The bucketed static shapes (the CUDA path, here on the CPU) run eagerly (backend None: what torch.compile
    traces, without compiling): states at real positions equal the packed eager trunk's, padded positions zero,
    tokens equal."""
    model = compiled(decoding_model(), backend=None, buckets=True)
    upsampled = [2 * n for n in LENGTHS_ACROSS_BUCKETS]
    h, mask = torch.randn(len(upsampled), max(upsampled), 32), padding_mask(upsampled)
    with torch.inference_mode():
        static = model.layers(h, mask, "src2tgt")
        eager = run_inference(h, mask, model.ops("src2tgt"))
    torch.testing.assert_close(static[mask], eager[mask], rtol=1e-5, atol=1e-5)
    assert not static[~mask].any()
    _check_equal_tokens(model, _sequences(LENGTHS_ACROSS_BUCKETS))


def test_the_cpu_compiles_unpadded_batches_and_packs_padded_ones(monkeypatch):
    """On a CPU a batch without padding takes the compiled trunk (`unpadded`) at its own shape, a padded batch the
    eager packed trunk: tokens equal the eager path's either way, both directions, greedy and beam."""
    taken = []
    unpadded = StaticTrunk.unpadded
    monkeypatch.setattr(StaticTrunk, "unpadded",
                        lambda self, h, mask, ops: taken.append(h.shape) or unpadded(self, h, mask, ops))
    model = compiled(decoding_model(), backend=None)
    assert not model.static_trunk.buckets
    sequences = _sequences(LENGTHS_ACROSS_BUCKETS)
    _check_equal_tokens(model, sequences, sizes=(1, 4))
    lengths = sorted(2 * n for n in LENGTHS_ACROSS_BUCKETS)
    assert sorted({shape[1] for shape in taken}) == lengths and {shape[0] for shape in taken} == {1}  # batch 1 only


def test_frozen_weights_that_change_are_refused():
    """The CPU's compiled trunk freezes the weights in: after an in-place change (an optimiser step,
    `load_state_dict`) a decode raises rather than use the old ones (Dynamo alone here, backend "eager"); a model
    built under inference mode (its weights have no version counter) compiles and decodes."""
    model = compiled(decoding_model(), backend="eager")
    sequence = _sequences([5])
    first = translate_ids(model, sequence, "src2tgt")
    assert translate_ids(model, sequence, "src2tgt") == first
    with torch.no_grad():
        model.ends["src"][0].feed_forward.inner.weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="weights changed after its trunk was compiled"):
        translate_ids(model, sequence, "src2tgt")
    assert compiled(model, backend="eager") and translate_ids(model, sequence, "src2tgt")  # compiled again: decodes
    with torch.inference_mode():  # a model built under inference mode: weights without version counters
        model = decoding_model()
        eager = translate_ids(model, sequence, "src2tgt")
        assert translate_ids(compiled(model, backend="eager"), sequence, "src2tgt") == eager


@pytest.mark.slow
def test_compiled_trunk_equals_the_eager_trunk_on_cpu():
    """Through inductor on CPU (generated C++ kernels) with the weights frozen in: sentences one at a time (one
    graph, lengths dynamic, compiled in about a minute on the project's 2-core box: the slow part) and a ragged
    batch (eagerly packed), the eager path's tokens; on a CPU with oneDNN every linear layer of the graph is a matmul
    on a weight packed at compile time (inductor's freezing took effect). After the weights change a decode raises,
    and compiled again the trunk is frozen with the new weights, not served the old graph (a second compile)."""
    from torch._dynamo.utils import counters

    counters.clear()
    model = compiled(decoding_model())
    _check_equal_tokens(model, _sequences([9, 12, 15]), ("src2tgt",), (1, 3))
    if torch.backends.mkldnn.is_available():
        linears = 4 * len(model.ops("src2tgt"))
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] % linears == 0
        assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] >= linears
    with torch.inference_mode():  # as a decode's states are: what the first graph's guards saw
        h, mask = torch.randn(1, 24, 32), torch.ones(1, 24, dtype=torch.bool)
    with torch.no_grad():
        for parameter in model.ends.parameters():
            parameter.mul_(1.5)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="weights changed"):
        model.layers(h, mask, "src2tgt")
    compiled(model)
    with torch.inference_mode():
        expected = run_inference(h, mask, model.ops("src2tgt"))
        torch.testing.assert_close(model.layers(h, mask, "src2tgt"), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_graphs_equal_the_eager_trunk():
    """mode "reduce-overhead" on CUDA (CUDA graphs), replayed: the same tokens as the eager trunk on CUDA."""
    model = compiled(decoding_model().cuda())
    sequences = _sequences(LENGTHS_ACROSS_BUCKETS)
    _check_equal_tokens(model, sequences)
    _check_equal_tokens(model, sequences)  # replays of recorded graphs
