"""How often a placement group outlives its killed creator without being flagged (the flake behind a resumed sweep's
held CPU).

An actor creates and removes placement groups in a loop (as a Ray Train controller creates its worker group's
while Tune kills the trial that owns it); the driver kills it with `ray.kill`, waits until the GCS has it DEAD,
then reads the placement-group table for the groups that actor left: how many carry the GCS's own
`creator_actor_dead` flag, how many do not (registered after the GCS had marked the actor dead: the flag is
set only on the groups it holds at the death), and whether `raytrain.release_orphaned_groups` removes them all.

    python -m bench.orphan_race [--kills 30]

Prints one line per kill and the totals; exits 1 if a group of a killed creator survives the release.
"""
from __future__ import annotations

import argparse
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from pipeline.training import raytrain


@ray.remote(num_cpus=0)
class GroupMaker:
    """Creates one tiny placement group after another, each waited for until placed and then removed (as a Ray
    Train controller makes its worker group's and removes it at the end), until killed. Not removed before it
    is placed: a group removed while the raylet is still reserving its bundle leaks the bundle's CPUs in
    Ray 2.60 (0.25 of 2 CPUs after 15 kills of such a loop, with no group left in the table)."""

    def loop(self) -> None:
        while True:
            group = placement_group([{"CPU": 0.001}])
            ray.get(group.ready())
            remove_placement_group(group)


def killed_maker_groups(job_id: str, settle_s: float = 0.5) -> tuple[str, list]:
    """Start a GroupMaker, kill it mid-loop, wait until the GCS has it DEAD (and `settle_s` more for requests
    it sent before), and return its actor id and the live groups it left."""
    from ray._private.state import state

    maker = GroupMaker.remote()
    ray.get(maker.__ray_ready__.remote(), timeout=60)
    maker.loop.remote()
    time.sleep(0.3)
    ray.kill(maker)
    actor_id = maker._actor_id.hex()
    deadline = time.monotonic() + 30
    while state.actor_table(actor_id).get("State") != "DEAD" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(settle_s)
    return actor_id, [g for g in raytrain.job_groups(job_id) if g.creator_actor_id.hex() == actor_id]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=30)
    args = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    job_id = ray.get_runtime_context().get_job_id()
    full = ray.cluster_resources()["CPU"]
    left = unflagged = survived = 0
    for kill in range(args.kills):
        actor_id, groups = killed_maker_groups(job_id)
        flagged = sum(g.creator_actor_dead for g in groups)
        raytrain.release_orphaned_groups(job_id)
        time.sleep(0.2)
        after = [g for g in raytrain.job_groups(job_id) if g.creator_actor_id.hex() == actor_id]
        print(f"kill {kill + 1:3d}: {len(groups)} group(s) left, {flagged} flagged dead, "
              f"{len(groups) - flagged} not; after release_orphaned_groups: {len(after)}", flush=True)
        left += len(groups)
        unflagged += len(groups) - flagged
        survived += len(after)
    free = ray.available_resources().get("CPU", 0)
    print(f"{args.kills} kills: {left} group(s) left by a killed creator, {unflagged} of them never flagged dead; "
          f"{survived} survived release_orphaned_groups; CPUs free at the end {free:g} of {full:g}")
    ray.shutdown()
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
