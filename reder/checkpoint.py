"""Model directories: everything needed to translate with a trained model, and nothing else.

A model directory holds `model.pt` (the state dict), `config.json` (the model's config, its `architecture`
"reder", "transformer" or "cmlm", the language codes, decoding defaults — a REDER's `blank_penalty` per
direction (REDER.blank_penalty) —
and for a teacher or a CMLM its `direction`) and `spm.model` (the joint SentencePiece model). Files are
written to temporary names and renamed, so an interrupted save never leaves a half-written model behind.
Directories written by older versions are read in the current layout: their config.json through `upgrade_meta`,
their state dict through `upgrade_state_dict` (a key map, torchtune's way); the live models only know their
own names.

Every `.pt` file is read with `load_tensors` (`torch.load(weights_only=True)`): tensors and plain containers,
numbers and strings only, so a pickle planted in a checkpoint cannot run code; a file that cannot be read
that way (corrupt, truncated, or holding other objects) is a ValueError naming it.
"""
import json
import math
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import DIRECTIONS, CmlmConfig, ModelConfig, TransformerConfig
from reder.model import REDER

MODEL_FILE, CONFIG_FILE, SPM_FILE = "model.pt", "config.json", "spm.model"
ARCHITECTURES = {"reder": (REDER, ModelConfig), "transformer": (Transformer, TransformerConfig), "cmlm": (CMLM, CmlmConfig)}
# Saved names of older layouts → today's: a REDER's DAG links were saved at the top level before the output
# heads were modules of their own (and until the model stopped renaming its own parameters when saved).
RENAMED_PREFIXES = {"links.": "head.links."}


def upgrade_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """config.json's contents as the current code writes them; `meta` unchanged. Directories written before the
    teacher and the CMLM had directories of their own lack `architecture` (they are REDER); those written before
    the train stage tuned a blank penalty lack a REDER's `blank_penalty` (0 both ways)."""
    meta = {"architecture": "reder", **meta}
    if meta["architecture"] == "reder" and "blank_penalty" not in meta:
        meta["blank_penalty"] = dict.fromkeys(DIRECTIONS, 0.0)
    return meta


def upgrade_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """A saved state dict (a model's, or a training checkpoint's model entry) with every key of an older layout
    renamed to today's (`RENAMED_PREFIXES`), order kept; a current one comes back equal."""
    def renamed(key: str) -> str:
        for old, new in RENAMED_PREFIXES.items():
            if key.startswith(old):
                return new + key[len(old):]
        return key

    return {renamed(key): value for key, value in state.items()}


def save_model_dir(directory: Path, model: REDER | Transformer | CMLM, spm_model: Path, src_lang: str, tgt_lang: str,
                   extra: Optional[dict[str, Any]] = None) -> Path:
    """Write a self-contained model directory (see module doc); returns it."""
    architecture = next((name for name, (cls, _) in ARCHITECTURES.items() if isinstance(model, cls)), None)
    if architecture is None:
        raise TypeError(f"save_model_dir: expected a REDER, Transformer or CMLM model, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    _atomic(directory / MODEL_FILE, lambda path: torch.save(state, path))
    meta = {"model": model.cfg.to_dict(), "src_lang": src_lang, "tgt_lang": tgt_lang, **(extra or {}), "architecture": architecture}
    if isinstance(model, REDER):
        meta["blank_penalty"] = dict(model.blank_penalty)
    _atomic(directory / CONFIG_FILE, lambda path: path.write_text(json.dumps(meta, indent=2), encoding="utf-8"))
    if Path(spm_model).resolve() != (directory / SPM_FILE).resolve():
        _atomic(directory / SPM_FILE, lambda path: shutil.copyfile(spm_model, path))
    return directory


def load_tensors(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """`torch.load(path, weights_only=True)`: a file that cannot be loaded that way is a one-line ValueError
    naming it (never unpickled with code execution)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:  # a disallowed global, or not a pickle at all
        reason = next((line.strip() for line in str(error).splitlines() if "WeightsUnpickler error" in line),
                      "not a PyTorch file of tensors")
        raise ValueError(f"{path}: not loadable with torch.load(weights_only=True), refused ({reason})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:  # truncated or corrupt archive
        raise ValueError(f"{path}: corrupt or truncated PyTorch file ({str(error).splitlines()[0][:200]})") from None


def read_meta(directory: Path) -> dict[str, Any]:
    """config.json of a model directory, with a clear error when it is not one."""
    directory = Path(directory)
    missing = [name for name in (MODEL_FILE, CONFIG_FILE, SPM_FILE) if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} is not a model directory: missing {missing}")
    path = directory / CONFIG_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise ValueError(f"{path}: expected an object with a 'model' section")
    return meta


def direction_of(meta: dict[str, Any], src: str, tgt: str, where: Path | str = "the model") -> str:
    """`src2tgt` or `tgt2src` for a language pair, by the model directory's `src_lang`/`tgt_lang`; a Transformer
    (one direction, `direction` in its meta) only for its own pair. ValueError naming the pairs otherwise."""
    pair = (meta.get("src_lang"), meta.get("tgt_lang"))
    directions = {pair: "src2tgt", pair[::-1]: "tgt2src"}
    direction = directions.get((src, tgt))
    own = meta.get("direction")
    if direction is None or (own and own != direction):
        offered = f"{pair[0]}->{pair[1]} and {pair[1]}->{pair[0]}" if not own else \
            "->".join(pair if own == "src2tgt" else pair[::-1])
        raise ValueError(f"{where} translates {offered}, not {src}->{tgt}")
    return direction


def load_model_dir(directory: Path, device: str | torch.device = "cpu") -> tuple[REDER | Transformer | CMLM, dict[str, Any]]:
    """The model (eval mode; REDER, Transformer or CMLM, by `architecture`) and its config.json contents."""
    meta = read_meta(directory)
    current = upgrade_meta(meta)
    architecture = current["architecture"]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{directory}: unknown architecture {architecture!r}; known: {sorted(ARCHITECTURES)}")
    model_class, config_class = ARCHITECTURES[architecture]
    try:
        model = model_class(config_class.from_dict(meta["model"], "model"))
    except ValueError as error:  # ConfigError: names the key path inside config.json
        raise ValueError(f"{Path(directory) / CONFIG_FILE}: {error}") from None
    path = Path(directory) / MODEL_FILE
    state = load_tensors(path)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, found {type(state).__name__}")
    try:
        model.load_state_dict(upgrade_state_dict(state))
    except RuntimeError as error:  # missing/unexpected keys or shapes that do not match config.json
        raise ValueError(f"{path}: does not fit {CONFIG_FILE} ({str(error).splitlines()[0]})") from None
    if isinstance(model, REDER):
        model.blank_penalty = _blank_penalty(current, Path(directory) / CONFIG_FILE)
    return model.to(device).eval(), meta


def _blank_penalty(meta: dict[str, Any], path: Path) -> dict[str, float]:
    """config.json's `blank_penalty` (direction → finite number; a direction absent: 0), ValueError naming it."""
    given = meta["blank_penalty"]
    numbers = isinstance(given, dict) and set(given) <= set(DIRECTIONS) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in given.values())
    if not numbers:
        raise ValueError(f"{path}: blank_penalty must map src2tgt/tgt2src to finite numbers, got {given!r}")
    return {direction: float(given.get(direction, 0.0)) for direction in DIRECTIONS}


def load_teacher_dir(directory: Path, direction: str, vocab_size: int, device: str | torch.device = "cpu") -> Transformer:
    """A teacher Transformer (eval mode) for `direction`, checked against the run's vocabulary size."""
    return _load_directional(directory, direction, vocab_size, "transformer", "a teacher", device)


def load_cmlm_dir(directory: Path, direction: str, vocab_size: int, device: str | torch.device = "cpu") -> CMLM:
    """A CMLM (eval mode) for `direction`, checked against the run's vocabulary size."""
    return _load_directional(directory, direction, vocab_size, "cmlm", "a CMLM", device)


def _load_directional(directory: Path, direction: str, vocab_size: int, expected: str, what: str,
                      device: str | torch.device) -> Transformer | CMLM:
    """A one-direction model directory of architecture `expected`, checked (direction, vocabulary size)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{what.split()[-1]} directory {directory} does not exist")
    meta = read_meta(directory)
    architecture = upgrade_meta(meta)["architecture"]
    if architecture != expected:
        raise ValueError(f"{directory} is not {what}: its architecture is {architecture!r}, expected {expected!r}")
    if meta.get("direction") != direction:
        raise ValueError(f"{directory}: the {what.split()[-1]} translates {meta.get('direction')!r}, but {direction!r} was asked for")
    if meta["model"]["vocab_size"] != vocab_size:
        raise ValueError(f"{directory}: vocabulary mismatch: {what.split()[-1]} has {meta['model']['vocab_size']} pieces, "
                         f"the run's SentencePiece model has {vocab_size}")
    model, _ = load_model_dir(directory, device)
    return model


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
