"""The training objectives, apart from the models (as fairseq's criterions): an objective is built from a model
and its own hyper-parameters, called on a batch, and returns its loss and the named terms a trainer logs one by
one; models never import objectives.

- reder/objectives/terms.py: the equations on tensors: `ctc_loss`, `dag_loss`, `forward_backward_agreement`,
  glancing's `glance_mask` and the CMLM's `uniform_mask`.
- reder/objectives/outputs.py: the loss of each output head (`output_loss`) and the counters it reports.
- reder/objectives/duplex.py: REDER's objective (`duplex_loss`, `cycle_consistency`, FBA's reverse pass,
  glancing's first pass) and `DuplexLoss(model, loss_config)`, the module DDP wraps.
- reder/objectives/directional.py: the teacher's and the CMLM's (`teacher_loss`, `cmlm_loss`; `TeacherObjective`,
  `CmlmObjective`) and `PairObjective`, both directions' at once.
"""
