"""Ctrl-C and SIGTERM in the pipeline CLI (run_pipeline.py): the handlers, and which signal stopped a run.

SIGTERM (`kill PID`, `ray job stop`, a scheduler's preemption) raises `Terminated` in the main thread, SIGINT
KeyboardInterrupt; each is remembered, so `interruption` can say which one was behind an error that a library
(Ray, Ray Train) made of it.
"""
from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`, `ray job stop`, a scheduler's preemption): raised in the main thread like Ctrl-C's
    KeyboardInterrupt, so the running stage removes its temporary output and its MLflow runs end KILLED.
    A KeyboardInterrupt because `ray.get` answers only those at once: it re-raises them as a bare
    KeyboardInterrupt, and any other exception a signal handler raises inside it surfaces as a SystemError
    only when the awaited object is ready (minutes into a training run). Which signal it was is therefore
    kept here, by the handlers (`interruption`)."""


_received: list[KeyboardInterrupt] = []  # what this process's signal handlers raised, latest last


def _raise_terminated(signum: int, frame: object) -> None:
    _received.append(Terminated(f"SIGTERM (signal {signum})"))
    raise _received[-1]


def _raise_interrupted(signum: int, frame: object) -> None:
    _received.append(KeyboardInterrupt(f"Ctrl-C (signal {signum})"))
    raise _received[-1]


def handle_sigterm() -> None:
    """SIGTERM raises `Terminated`, SIGINT KeyboardInterrupt, each remembered (main thread only; `ray.init`
    installs its own SIGTERM handler, a sys.exit: call again after)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGINT, _raise_interrupted)


def interruption(error: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM behind `error`, if any: the latest our handlers raised when `error`, its cause
    or its context (a library that catches what the signal raised inside it and raises its own error, as
    Ray Train's fit does) is a KeyboardInterrupt, which `ray.get` may have made of our Terminated."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return _received[-1] if _received else error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def forget() -> None:
    """Forget the signals received so far (a new command starts)."""
    _received.clear()
