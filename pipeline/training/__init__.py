"""Training on Ray Train, one path for REDER, the teachers and the CMLMs: the driver (`raytrain`: resources, the
trainer, fit, averaging, the run's report), the workers' loop (`trainloop`: data, validation, checkpoints, MLflow),
the training core both run (`harness`: updates, batches, budgets, without Ray), a group's torch process group
(`process_group`) and the names of the files a run hands on (`runfiles`)."""
