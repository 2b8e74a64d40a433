"""The duplex pipeline: one module per stage (`run(cfg, workdir) -> output dir`), config, tracking."""
