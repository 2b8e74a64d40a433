"""A real two-process gloo DDP step through the memory-efficient path, checked against one process."""
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from reder import EOS_ID, DuplexLoss, LossConfig
from tests.reder.helpers import tiny_model

LOSS = LossConfig(lambda_fba=0.5, lambda_cc=0.5, aux_start_step=0)


def _model():
    torch.manual_seed(0)
    return tiny_model(dropout=0.0, attention_dropout=0.0, memory_efficient=True).train()


def _batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, : length - 1] = torch.randint(4, 11, (length - 1,), generator=generator)
        tokens[row, length - 1] = EOS_ID
    return tokens, torch.tensor(lengths)


SRC, SRC_LENGTHS = _batch([6, 4, 5, 3], seed=1)
TGT, TGT_LENGTHS = _batch([5, 5, 3, 4], seed=2)


def _worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model = _model()
        objective = DistributedDataParallel(DuplexLoss(model, LOSS))
        half = slice(2 * rank, 2 * rank + 2)
        terms = objective(SRC[half], SRC_LENGTHS[half], TGT[half], TGT_LENGTHS[half], 0)
        terms["total"].backward()
        state = {
            "grads": {name: p.grad.clone() for name, p in model.named_parameters()},
            "actnorm": {name: t.clone() for name, t in model.actnorm.state_dict().items()},
        }
        torch.save(state, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_process_ddp_step_matches_single_process(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    reference = _model()
    reference.initialize(SRC, SRC_LENGTHS, TGT, TGT_LENGTHS)  # ActNorm statistics of the whole batch
    objective = DuplexLoss(reference, LOSS)
    losses = [
        objective(SRC[h], SRC_LENGTHS[h], TGT[h], TGT_LENGTHS[h], step=0)["total"] for h in (slice(0, 2), slice(2, 4))
    ]
    (sum(losses) / 2).backward()  # DDP averages the ranks' gradients

    for name, value in reference.actnorm.state_dict().items():  # data-init statistics were all-reduced
        assert torch.allclose(ranks[0]["actnorm"][name].float(), value.float(), atol=1e-5), name
        assert torch.equal(ranks[0]["actnorm"][name], ranks[1]["actnorm"][name]), name
    for name, param in reference.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
        for rank in ranks:
            assert torch.allclose(rank["grads"][name], param.grad, atol=1e-5, rtol=1e-4), name
