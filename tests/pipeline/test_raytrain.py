"""pipeline.raytrain's pieces: the resource check (on a local Ray) and the teachers' objective."""
import pytest
import torch

from pipeline import raytrain
from pipeline.config import TrainConfig
from pipeline.stage import StageError
from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.ctc import pad_batch


def test_an_unsatisfiable_request_fails_fast_with_the_numbers(ray_session):
    with pytest.raises(StageError, match=r"GPU: need 2, cluster has 0.*use_gpu=false"):
        raytrain.check_resources(TrainConfig(num_workers=2, use_gpu=True), timeout_s=0.5)
    with pytest.raises(StageError, match=r"CPU: need 12, cluster has 2"):
        raytrain.check_resources(TrainConfig(num_workers=3, cpus_per_worker=4), timeout_s=0.5)
    raytrain.check_resources(TrainConfig(num_workers=2), timeout_s=0.5)  # fits: returns


def test_teacher_objective_reads_the_batch_in_its_direction():
    model = Transformer(TransformerConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                          decoder_layers=1, dropout=0.0, max_positions=32))
    src, src_lengths = pad_batch([[4, 5, 3], [6, 3]])
    tgt, tgt_lengths = pad_batch([[7, 3], [8, 9, 10, 3]])
    forward = raytrain.TeacherObjective(model, "src2tgt")(src, src_lengths, tgt, tgt_lengths, 0)
    backward = raytrain.TeacherObjective(model, "tgt2src")(src, src_lengths, tgt, tgt_lengths, 0)
    assert set(forward) == {"nll_src2tgt", "total"} and set(backward) == {"nll_tgt2src", "total"}
    torch.testing.assert_close(forward["total"], model.loss(src, src_lengths, tgt, tgt_lengths)["total"])
    torch.testing.assert_close(backward["nll_tgt2src"], model.loss(tgt, tgt_lengths, src, src_lengths)["nll"])
