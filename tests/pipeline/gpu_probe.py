"""A Ray `worker_process_setup_hook` for tests/pipeline/test_gpu.py: in every Ray worker process it wraps the
two GPU code paths (the training objective's forward, the distill actor's constructor) so that each process
writes, once per path, what that path ran with — device, autocast, process-group backend, parameter dtypes —
as a JSON line to the file named by $DUPLEX_GPU_PROBE. The assertions stay in the test, in the driver."""
from __future__ import annotations

import json
import os

import torch

PROBE_ENV = "DUPLEX_GPU_PROBE"


def _record(seen: set[str], path: str, **fields: object) -> None:
    if path in seen:
        return
    seen.add(path)
    with open(os.environ[PROBE_ENV], "a", encoding="utf-8") as probe:  # one short append per process and path
        probe.write(json.dumps({"path": path, "pid": os.getpid(), **fields}) + "\n")


def install() -> None:
    """Wrap DuplexLoss.forward and TeacherDecoder.__init__ in this process (Ray calls it at worker start)."""
    import torch.distributed as dist

    from pipeline.stages import distill
    from reder import DuplexLoss

    seen: set[str] = set()
    forward, init = DuplexLoss.forward, distill.TeacherDecoder.__init__

    def probed_forward(self, src_tokens, *args, **kwargs):
        terms = forward(self, src_tokens, *args, **kwargs)
        _record(seen, "train", device=str(src_tokens.device), autocast=torch.is_autocast_enabled("cuda"),
                autocast_dtype=str(torch.get_autocast_dtype("cuda")),
                backend=dist.get_backend() if dist.is_initialized() else None,
                parameter_dtypes=sorted({str(p.dtype) for p in self.parameters()}),
                total_finite=bool(torch.isfinite(terms["total"]).item()))
        return terms

    def probed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        models = [decoder.args[0] for decoder in self.decoders.values() if getattr(decoder, "args", ())]
        _record(seen, "distill", device=self.device, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                parameter_devices=sorted({str(p.device) for model in models for p in model.parameters()}))

    DuplexLoss.forward = probed_forward
    distill.TeacherDecoder.__init__ = probed_init
