"""Run a test module's independent slow jobs two at a time, each test then reads its own result.

The suite's budget is 2 cores and pytest runs one test at a time, so while one test waits
for a subprocess (a benchmark script, a notebook kernel, a matrix run) the other core
idles.  A module-scoped fixture hands :func:`run_selected` one job per selected test; the
jobs start together (two at a time), and each test gets its job's value, or the exception
its job raised (a subprocess's ``TimeoutExpired`` included: every job keeps its own timeout).
Only the jobs of the tests pytest selected run (``-k`` picks one, one runs).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable

# Two: the cores `make test` is budgeted on.  More would not finish sooner there, and each
# job is a whole process (MXNet imported) or a kernel.
WORKERS = 2


def selected(request, name: str) -> list:
    """The values of parameter ``name`` in the selected tests of ``request``'s module, in order."""
    seen = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is request.module and name in params \
                and params[name] not in seen:
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
    """Start every job (``WORKERS`` at a time, in the given order) and return their results."""
    pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="concurrently")
    futures = {key: pool.submit(job) for key, job in jobs.items()}
    pool.shutdown(wait=False)  # the threads finish their queue; results are awaited per test
    return Results(futures)
