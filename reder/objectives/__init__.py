"""The training objectives, apart from the models (as fairseq's criterions): a model gives outputs, an
objective returns its loss and the named terms a trainer logs one by one.

- reder/objectives/terms.py: the equations on tensors: `ctc_loss`, `dag_loss`, `forward_backward_agreement`,
  and glancing's `glance_mask`.
- reder/objectives/duplex.py: REDER's objective (`duplex_loss`, `cycle_consistency`, FBA's reverse pass,
  glancing's first pass) and `DuplexLoss`, the module DDP wraps.
- reder/objectives/directional.py: the teacher's and the CMLM's (`TeacherObjective`, `CmlmObjective`) and
  `PairObjective`, both directions' at once.

The names are importable from here too (`from reder.objectives import cycle_consistency`), loaded on first use:
the heads import terms.py, and duplex.py imports the heads.
"""
from importlib import import_module

_HOMES = {
    "terms": ("ctc_loss", "dag_loss", "forward_backward_agreement", "glance_mask"),
    "duplex": ("DuplexLoss", "cycle_consistency", "duplex_loss", "glance", "reverse_states"),
    "directional": ("CmlmObjective", "PairObjective", "TeacherObjective"),
}
__all__ = sorted(name for names in _HOMES.values() for name in names)


def __getattr__(name: str):
    """The public names of the three modules, imported on first use."""
    for module, names in _HOMES.items():
        if name in names:
            return getattr(import_module(f"reder.objectives.{module}"), name)
    raise AttributeError(f"module 'reder.objectives' has no attribute {name!r}")
