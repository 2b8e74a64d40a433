"""reder/static.py: the trunk at bucketed static shapes under torch.compile, against the eager inference path."""
import pytest
import torch

from reder.inference import run_inference
from reder.static import LENGTHS, bucket, compiled, pad_to_bucket
from reder.translate import translate_ids
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


def _check_equal_tokens(model, sequences: list[list[int]], directions: tuple[str, ...] = ("src2tgt", "tgt2src"),
                        sizes: tuple[int, ...] = (1, 3, 4)) -> None:
    """The static trunk's tokens equal the eager trunk's, CTC greedy and beam, at each batch size of `sizes`:
    1 (each length its own bucket), 3 (a batch bucket of 4: one added sentence), 4 (all at once)."""
    static_trunk, model.static_trunk = model.static_trunk, None
    runs = [(direction, beam, size) for direction in directions for beam in (1, 3) for size in sizes]
    eager = [translate_ids(model, sequences, direction, beam, size) for direction, beam, size in runs]
    model.static_trunk = static_trunk
    for (direction, beam, size), expected in zip(runs, eager):
        assert translate_ids(model, sequences, direction, beam, size) == expected, (direction, beam, size)


def test_static_shapes_equal_the_eager_trunk():
    """The bucketed static shapes run eagerly (backend None: what torch.compile traces, without compiling): states at
    real positions equal the packed eager trunk's, padded positions zero, tokens equal."""
    model = compiled(decoding_model(), backend=None)
    upsampled = [2 * n for n in LENGTHS_ACROSS_BUCKETS]
    h, mask = torch.randn(len(upsampled), max(upsampled), 32), padding_mask(upsampled)
    with torch.inference_mode():
        static = model.layers(h, mask, "src2tgt")
        eager = run_inference(h, mask, model.ops("src2tgt"))
    torch.testing.assert_close(static[mask], eager[mask], rtol=1e-5, atol=1e-5)
    assert not static[~mask].any()
    _check_equal_tokens(model, _sequences(LENGTHS_ACROSS_BUCKETS))


@pytest.mark.slow
def test_compiled_trunk_equals_the_eager_trunk_on_cpu():
    """Through inductor on CPU (generated C++ kernels): one graph, a ragged batch of 3 in the bucket (4, 64), one
    sentence added (a graph compiled in 1–2 minutes on the project's 2-core box under load: the slow part; the
    buckets themselves are the test above's)."""
    _check_equal_tokens(compiled(decoding_model()), _sequences([3, 9, 30]), ("src2tgt",), (3,))


@pytest.mark.gpu
def test_cuda_graphs_equal_the_eager_trunk():
    """mode "reduce-overhead" on CUDA (CUDA graphs), replayed: the same tokens as the eager trunk on CUDA."""
    model = compiled(decoding_model().cuda())
    sequences = _sequences(LENGTHS_ACROSS_BUCKETS)
    _check_equal_tokens(model, sequences)
    _check_equal_tokens(model, sequences)  # replays of recorded graphs
