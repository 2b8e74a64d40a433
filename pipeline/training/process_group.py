"""Ray Train's torch process-group backend for a group of workers, with a controller that never imports torch.

Ray's `TorchConfig` sets up the process group (gloo on CPUs, NCCL on GPUs) from the run's controller, a process of
its own, and its module imports torch at the top: the controller pays that import (~1.2 s of a 2-core box's 7.5 s
from a two-worker stage's start to its first update, bench/train_start.py --timeline) before it places the
workers, who import torch themselves anyway. `ProcessGroupConfig` is the same set-up, done by the same
worker-side functions of `ray.train.torch.config`, called through the shims below that import them on the
workers only. What it leaves out of Ray's: TPU process groups (`tpu_dist`, multi-slice) and Train v1 worker
groups; neither is used here. This module must not import torch (tests/pipeline/test_train.py checks it).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

log = logging.getLogger(__name__)


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def _set_distributed_env_vars() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _setup_process_group(**kwargs: Any) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


def default_backend(gpus_per_worker: float) -> str:
    """The process group's backend where none is named: NCCL where each worker holds whole GPUs; gloo on CPUs and
    where each holds a fraction of one (`train.gpus_per_worker` 0.5), as Ray may then place two ranks on one GPU,
    which NCCL refuses (gloo takes CUDA tensors for DDP's all-reduce too, slower)."""
    return "nccl" if gpus_per_worker >= 1 else "gloo"


@dataclass
class ProcessGroupConfig(BackendConfig):
    """`TorchConfig`'s fields and defaults, but for fractional GPUs: backend None is `default_backend` of the
    workers' GPUs. Not its train-function context, which sets each worker's CUDA device: `trainloop.train_loop`
    does that first."""

    backend: str | None = None
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type:
        return ProcessGroupBackend

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH


class ProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: ProcessGroupConfig) -> None:
        import ray
        from ray.train._internal.utils import get_address_and_port

        backend = backend_config.backend or default_backend(worker_group.get_resources_per_worker().get("GPU", 0))
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_master, addr=addr, port=port)
        worker_group.execute(_set_distributed_env_vars)  # LOCAL_RANK and the rest, before init_process_group
        size = len(worker_group)
        ray.get([worker_group.execute_single_async(rank, _setup_process_group, backend=backend, world_rank=rank,
                                                   world_size=size, init_method="env://",
                                                   timeout_s=backend_config.timeout_s)
                 for rank in range(size)])

    def on_shutdown(self, worker_group: Any, backend_config: ProcessGroupConfig) -> None:
        import ray
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                         TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)

        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            log.warning("the torch process group's shutdown timed out after %s s", timeout_s)
