"""The training objectives, apart from the models (as fairseq's criterions): a model gives outputs, an
objective returns its loss and the named terms a trainer logs one by one.

- reder/objectives/terms.py: the equations on tensors: `ctc_loss`, `dag_loss`, `forward_backward_agreement`,
  glancing's `glance_mask` and the CMLM's `uniform_mask`.
- reder/objectives/duplex.py: REDER's objective (`duplex_loss`, `cycle_consistency`, FBA's reverse pass,
  glancing's first pass) and `DuplexLoss`, the module DDP wraps.
- reder/objectives/directional.py: the teacher's and the CMLM's (`teacher_loss`, `cmlm_loss`; `TeacherObjective`,
  `CmlmObjective`) and `PairObjective`, both directions' at once.

The names are importable from here too (`from reder.objectives import cycle_consistency`), loaded on first use:
the heads import terms.py, duplex.py imports the heads, and the teacher and the CMLM import directional.py.
"""
from importlib import import_module

_HOMES = {
    "terms": ("ctc_loss", "dag_loss", "forward_backward_agreement", "glance_mask", "uniform_mask"),
    "duplex": ("DuplexLoss", "cycle_consistency", "duplex_loss", "glance", "reverse_states"),
    "directional": ("CmlmObjective", "PairObjective", "TeacherObjective", "cmlm_loss", "teacher_loss"),
}
__all__ = sorted(name for names in _HOMES.values() for name in names)


def __getattr__(name: str):
    """The public names of the three modules, imported on first use."""
    for module, names in _HOMES.items():
        if name in names:
            return getattr(import_module(f"reder.objectives.{module}"), name)
    raise AttributeError(f"module 'reder.objectives' has no attribute {name!r}")
