"""Resident memory stays flat on every path (benchmarks/memory.py's loops).

Each case runs in a fresh interpreter (its readings are the process's own): the loop of
``x.attach_grad()``, a recorded call, ``backward()`` with nothing read back, measured
after warm-up with ``mx.nd.waitall()`` and ``gc.collect()``.  The reference is the same
loop in MXNet's own operators, run beside it.  The short run (make test) fails on a
leak of 100 KiB a call or an end 64 MiB above MXNet's, and ``ops.focal_loss`` on
``(64, 1000, 5)`` logits at 500 KiB a call (a loop that ran ahead of MXNet's engine grew
1.5-2 MiB a call: the ``runahead`` fix; with it, a one-time move of glibc's high-water
mark reads as up to about 100 KiB a call either way over so short a run); ``make soak``
runs 5,000 calls a case and asks for at most 2 KiB a call.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _memory():
    spec = importlib.util.spec_from_file_location("memory_bench", ROOT / "benchmarks" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


memory = _memory()
SHORT = [
    "ours, forced_path('function'), 10 lengths",
    "ours, forced_path('custom')",
    "ours, inline=False, hybridized",
    "ours, inline=False, 10 lengths",
]
RUN_AHEAD = ["ops.focal_loss, (64, 1000, 5)", "ops.focal_loss, (64, 1000, 5), hybridized"]
FOCAL = "mxnet: focal loss in MXNet's operators"
# (the (64, 1000, 5) cases run short only: MXNet's own loop there needs 5 MiB a call; 1,000
# values of k, a graph each, fill the memory budget, 256 MiB by default, by design)
BUDGET_BOUND = ["ours, 1,000 values of k (a graph each)"]
OURS = [
    n
    for n in memory.CASES
    if n.startswith(("ours", "ops.")) and n not in RUN_AHEAD and n not in BUDGET_BOUND
]


def _growth(found: dict) -> float:
    return found["growth_kib"]


@pytest.fixture(scope="module")
def native_short():
    return memory.measure("mxnet x*x", 60, 200, timeout=120)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
@pytest.mark.parametrize("case", SHORT)
def test_a_short_loop_stays_near_mxnets_own(case, native_short):
    found = memory.measure(case, 60, 200, timeout=120)
    # a leak of 100 KiB a call shows as 20 MiB over these 200 calls; the pile-up of
    # MXNet's custom-op workers as 250-350 MiB above MXNet's loop.  Under load glibc's
    # high-water mark can move once by about 20 MiB in a process that does not grow (one
    # run in 8 read 102 KiB a call, the others 0.5 or 26, on a tree before and after a
    # change that does not run in the loop): a leak grows in a second process too
    if found["growth_kib"] >= 100:
        found = min(found, memory.measure(case, 60, 200, timeout=120), key=_growth)
    assert found["growth_kib"] < 100, found
    assert found["end_mib"] < native_short["end_mib"] + 64, (found, native_short)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
@pytest.mark.parametrize("case", RUN_AHEAD)
def test_a_loop_of_big_steps_stays_within_a_few_calls_of_mxnets_engine(case):
    # 2 MiB a step: with the runahead fix off, 1,500-2,043 KiB a call over these 150 calls
    # (MXNet's own operators of the same formula: about 5,000); with it -75 to +108 KiB,
    # glibc's high-water mark moving once by up to 16 MiB (a few steps' arrays) either way
    found = memory.measure(case, 60, 150, timeout=180)
    assert found["growth_kib"] < 500, found


@pytest.mark.soak
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
@pytest.mark.parametrize("case", OURS)
def test_a_long_loop_stays_flat(case):
    # ops.focal_loss: against the same formula in MXNet's operators (which grow in MXNet
    # alone, the engine running behind a loop that reads nothing back: ours no longer do,
    # the runahead fix); 1,000 lengths cycled: against MXNet's loop on the same lengths,
    # after two passes (a signature's second call plans its graph: 31 KiB resident each,
    # MXNet's shape and memory passes at a new size; planned, it stays within 2 KiB a call)
    reference = (
        FOCAL
        if case.startswith("ops.focal_loss")
        else "mxnet x*x, 1,000 lengths"
        if "1,000 lengths" in case
        else "mxnet x*x"
    )
    warmup = 2000 if "1,000 lengths" in case else 1000
    native = memory.measure(reference, warmup, 5000, timeout=1800)
    found = memory.measure(case, warmup, 5000, timeout=1800)
    assert found["growth_kib"] <= 2, (found, native)
    assert found["end_mib"] < native["end_mib"] + 64, (found, native)
