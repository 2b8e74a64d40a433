"""Connect the driver to Ray: a running cluster (`address`) or a local instance started here."""
from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import RayConfig

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


def ensure_ray(cfg: RayConfig, dashboard: bool = False) -> None:
    """Initialise Ray once per process; a no-op when the caller (or a test fixture) already did.
    `dashboard`: start the dashboard with a local instance (Tune sweeps need it, see below)."""
    import ray

    if ray.is_initialized():
        return
    if cfg.address:
        # Workers on other machines import `pipeline` from the shipped working directory.
        ray.init(address=cfg.address, runtime_env={
            "working_dir": str(REPO_ROOT), "excludes": [".venv/", ".git/", "runs/", "*.parquet"]})
    else:
        # The dashboard serves the State API, through which Ray Train V2's PlacementGroupCleaner sees a
        # dead controller: without it, a Tune trial stopped by ASHA leaks its workers' placement group and
        # the next trials wait for CPUs forever. A plain run does without its processes.
        kwargs = {"include_dashboard": dashboard}
        if cfg.num_cpus:
            kwargs["num_cpus"] = cfg.num_cpus
        if cfg.object_store_memory_mb:
            kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024 * 1024
        ray.init(**kwargs)
    log.info("ray: %s CPUs available", ray.available_resources().get("CPU", 0))
