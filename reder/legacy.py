"""The one place that knows older model layouts: everything else reads the current one.

- `upgrade_meta`: a model directory's config.json as the current code writes it. Directories written before
  the teacher and the CMLM had directories of their own lack `architecture` (they are REDER); those written
  before the train stage tuned a blank penalty lack a REDER's `blank_penalty` (0 both ways).
- `keep_saved_head_names`: a REDER's head keeps the names its parameters had before heads were modules
  (`links.*` at the top level, not `head.links.*`), in `state_dict` and in `load_state_dict` (missing or
  unexpected keys are named as saved), so model directories and training checkpoints of every version load.
"""
from typing import Any

from torch import nn

from reder.config import DIRECTIONS


def upgrade_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """config.json's contents with what older directories lack filled in (see module doc); `meta` unchanged."""
    meta = {"architecture": "reder", **meta}
    if meta["architecture"] == "reder" and "blank_penalty" not in meta:
        meta["blank_penalty"] = dict.fromkeys(DIRECTIONS, 0.0)
    return meta


def keep_saved_head_names(model: nn.Module) -> None:
    """Register on `model` (whose last child is `head`) the hooks that keep its head's saved names."""
    model.register_state_dict_post_hook(_flatten_head_keys)
    model.register_load_state_dict_pre_hook(_nest_head_keys)
    model.register_load_state_dict_post_hook(_flatten_incompatible_keys)


def _flatten_head_keys(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """state_dict hook: the head's entries go under `prefix` + their own names (`links.…`), not `head.links.…`."""
    for key in [key for key in state if key.startswith(prefix + "head.")]:  # the head is the last child:
        state[prefix + key[len(prefix + "head."):]] = state.pop(key)  # re-inserting keeps the state's order


def _nest_head_keys(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook: saved `prefix` + `links.…` entries go to the head's `head.links.…`."""
    owned = tuple(f"{prefix}{name}." for name, _ in module.head.named_children())
    for key in [key for key in state if key.startswith(owned)]:
        state[prefix + "head." + key[len(prefix):]] = state.pop(key)


def _flatten_incompatible_keys(module: nn.Module, incompatible: Any) -> None:
    """load_state_dict post-hook: missing or unexpected head entries are named as saved (`links.…`)."""
    for marker in [f"head.{name}." for name, _ in module.head.named_children()]:
        for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
            keys[:] = [key.replace(marker, marker[len("head."):], 1) if key.startswith(marker) or f".{marker}" in key else key
                       for key in keys]
