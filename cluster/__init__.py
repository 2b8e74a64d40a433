"""Ray cluster helpers: the `ray up` configs' offline check, the head node's services, connecting a driver.

This package takes plain values and imports nothing from `pipeline` or `reder` (so the head node's
services run without torch); its errors are `ClusterError`s.
"""


class ClusterError(RuntimeError):
    """The cluster cannot be used as asked (a bad cluster file, storage not shared); the message says why."""
