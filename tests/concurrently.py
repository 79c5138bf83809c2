"""Run a test module's independent slow jobs once, up front; each test then reads its own result.

A module-scoped fixture hands :func:`run_selected` one job per selected test; each test
gets its job's value, or the exception its job raised (a subprocess's ``TimeoutExpired``
included: every job keeps its own timeout).  Only the jobs of the tests pytest selected run
(``-k`` picks one, one runs).

The jobs run one after another in the fixture's own thread.  Run two at a time from
worker threads (as first written, to use both cores), they hung the suite on Python 3.8
twice: a worker thread starting a subprocess runs MXNet's fork step (customop's ``fork``
patch stops and restarts MXNet's engine), and the test thread, meanwhile using MXNet
(``mx.random.seed``), joined an engine worker that never ended (gdb on the hung run).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Hashable


def selected(request, name: str) -> list:
    """The values of parameter ``name`` in the selected tests of ``request``'s module, in order."""
    seen = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (
            getattr(item, "module", None) is request.module
            and name in params
            and params[name] not in seen
        ):
            seen.append(params[name])
    return seen


class Results:
    """What each job returned; ``results[key]`` raises what the job raised, in the test."""

    def __init__(self, futures: dict):
        self._futures = futures

    def __getitem__(self, key: Hashable) -> Any:
        return self._futures[key].result()

    def wait(self) -> None:
        """Wait for every job (a fixture's teardown: none runs on beside the next module)."""
        for future in self._futures.values():
            future.exception()


def run_selected(jobs: dict[Hashable, Callable[[], Any]]) -> Results:
    """Run every job (in the given order, in this thread) and return their results."""
    futures = {}
    for key, job in jobs.items():
        futures[key] = future = Future()
        try:
            future.set_result(job())
        except BaseException as exc:  # noqa: BLE001 - the job's test raises it
            future.set_exception(exc)
    return Results(futures)
