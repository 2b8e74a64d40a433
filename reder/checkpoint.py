"""Model directories: everything needed to translate with a trained model, and nothing else.

A model directory holds `model.pt` (the state dict), `config.json` (the ModelConfig, the language codes
and decoding defaults) and `spm.model` (the joint SentencePiece model). Files are written to temporary
names and renamed, so an interrupted save never leaves a half-written model behind.
"""
import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from reder.config import ModelConfig
from reder.model import REDER

MODEL_FILE, CONFIG_FILE, SPM_FILE = "model.pt", "config.json", "spm.model"


def save_model_dir(directory: Path, model: REDER, spm_model: Path, src_lang: str, tgt_lang: str,
                   extra: Optional[dict[str, Any]] = None) -> Path:
    """Write a self-contained model directory (see module doc); returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    _atomic(directory / MODEL_FILE, lambda path: torch.save(state, path))
    meta = {"model": model.cfg.to_dict(), "src_lang": src_lang, "tgt_lang": tgt_lang, **(extra or {})}
    _atomic(directory / CONFIG_FILE, lambda path: path.write_text(json.dumps(meta, indent=2), encoding="utf-8"))
    if Path(spm_model).resolve() != (directory / SPM_FILE).resolve():
        _atomic(directory / SPM_FILE, lambda path: shutil.copyfile(spm_model, path))
    return directory


def read_meta(directory: Path) -> dict[str, Any]:
    """config.json of a model directory, with a clear error when it is not one."""
    directory = Path(directory)
    missing = [name for name in (MODEL_FILE, CONFIG_FILE, SPM_FILE) if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} is not a model directory: missing {missing}")
    return json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))


def load_model_dir(directory: Path, device: str | torch.device = "cpu") -> tuple[REDER, dict[str, Any]]:
    """The model (eval mode) and its config.json contents."""
    meta = read_meta(directory)
    model = REDER(ModelConfig.from_dict(meta["model"]))
    model.load_state_dict(torch.load(Path(directory) / MODEL_FILE, map_location="cpu", weights_only=True))
    return model.to(device).eval(), meta


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of floating-point tensors (fairseq's checkpoint averaging); other tensors
    (e.g. ActNorm's `initialized` flags) must agree and are taken from the first state."""
    if not states:
        raise ValueError("average_state_dicts: no states given")
    keys = set(states[0])
    for state in states[1:]:
        if set(state) != keys:
            raise ValueError(f"average_state_dicts: states have different keys: {sorted(keys ^ set(state))}")
    averaged = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            averaged[name] = torch.stack([state[name].double() for state in states]).mean(0).to(first.dtype)
        else:
            if any(not torch.equal(state[name], first) for state in states[1:]):
                raise ValueError(f"average_state_dicts: non-float tensor {name!r} differs between states")
            averaged[name] = first.clone()
    return averaged


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
