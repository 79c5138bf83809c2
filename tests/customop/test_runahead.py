"""The ``runahead`` fix (customop/runtime/runahead.py): a thread calling our ops stays within a
few calls of MXNet's engine, and every failure still reaches the user's own read."""

import sys
import textwrap
from pathlib import Path

import pytest

from tests import fresh

ROOT = Path(__file__).resolve().parents[2]

# A failure of ours poisons the array a graph reads (a Custom node's forward fails in an
# executor nobody has read yet); then 3 x EVERY calls of ops.focal_loss (imperative graph
# path, or a hybridized block whose cached graph inlines it) read it, with nothing read
# back: the throttle pushes and waits for its markers on outputs that carry the failure.
# The user's own read must still raise it, named.
POISONED_INPUT = textwrap.dedent("""
    import json, sys
    import mxnet as mx, numpy as np
    from customop import customop, ops, runtime
    from customop.runtime import runahead

    HOW, THROTTLE = sys.argv[1], sys.argv[2]
    if THROTTLE == "waits on the outputs":  # what the fix must not do
        def step(outs):
            for o in [outs] if hasattr(outs, "handle") else outs:
                try:
                    o.wait_to_read()
                except Exception:
                    pass  # the throttle's own wait swallows it ...
        runahead.step = step

    class LabelError(Exception):
        pass

    @customop("numpy", infer_shape=lambda x: x)
    def fails_when_run(x):
        raise LabelError("label 7 out of range")

    label = mx.nd.array(np.random.RandomState(0).randint(-1, 5, (8, 100)))
    f = ops.focal_loss
    if HOW == "hybridized":
        class Block(mx.gluon.HybridBlock):
            def hybrid_forward(self, F, x, label):
                return ops.focal_loss(x, label)
        f = Block()
        f.hybridize()
    for _ in range(3):  # the graph path from the second call on
        with mx.autograd.record():
            f(mx.nd.ones((8, 100, 5)), label)
    mx.nd.waitall()
    ex = fails_when_run(mx.sym.var("x")).bind(mx.cpu(), {"x": mx.nd.ones((8, 100, 5))})
    ex.forward()
    outs = []
    for _ in range(3 * runahead.EVERY):
        with mx.autograd.record():
            outs.append(f(ex.outputs[0], label))
    mine = getattr(runahead._local, "thread", None)
    try:
        outs[-1].asnumpy()
        read = "returned"
    except Exception as exc:
        read = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"read": read, "installed": runtime.installed(),
                      "marked": mine is not None and mine.semaphore is not None}))
""")


def _poisoned(how: str, throttle: str) -> dict:
    return fresh.run_json([sys.executable, "-c", POISONED_INPUT, how, throttle], cwd=ROOT)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fix is Linux-only")
@pytest.mark.parametrize("how", ["imperative", "hybridized"])
def test_a_failure_reaches_the_users_read_with_the_throttle_on(how):
    found = _poisoned(how, "runahead")
    assert "runahead" in found["installed"] and found["marked"], found
    assert found["read"].startswith(
        "LabelError: customop '__main__.fails_when_run' (forward): label 7 out of range"
    ), found


@pytest.mark.parametrize("how", ["imperative", "hybridized"])
def test_a_throttle_that_waited_on_the_outputs_would_lose_it(how):
    # MXNet 1.9.1 clears a failure once it is raised (ThreadedEngine::ThrowException), for
    # every array that shares it: why the markers wait on a semaphore, not on an array
    found = _poisoned(how, "waits on the outputs")
    assert found["read"] == "returned", found


def _marks_on(daemon: bool) -> bool:
    import threading

    import mxnet as mx
    import numpy as np

    from customop import ops, runtime
    from customop.runtime import runahead

    label = mx.nd.array(np.random.RandomState(0).randint(-1, 5, (2, 3)))
    found = {}

    def loop():
        x = mx.nd.ones((2, 3, 4))
        for _ in range(3 * runahead.EVERY):
            with mx.autograd.record():
                ops.focal_loss(x, label)
        mine = runahead._local.thread
        found["marked"] = mine.semaphore is not None
        mx.nd.waitall()

    thread = threading.Thread(target=loop, daemon=daemon)
    thread.start()
    thread.join(60)
    assert "runahead" in runtime.installed() or runtime.disabled("runahead")
    return found["marked"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fix is Linux-only")
def test_a_daemon_thread_never_waits_and_others_do():
    from customop import runtime

    if runtime.disabled("runahead"):
        pytest.skip("CUSTOMOP_RUNTIME_OFF=runahead")
    assert _marks_on(daemon=False)
    assert not _marks_on(daemon=True)  # MXNet's workers are daemon threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fix is Linux-only")
def test_a_thread_that_ends_gives_its_semaphore_to_the_next():
    from customop import runtime
    from customop.runtime import runahead

    if runtime.disabled("runahead"):
        pytest.skip("CUSTOMOP_RUNTIME_OFF=runahead")
    for _ in range(3):
        assert _marks_on(daemon=False)
    assert 1 <= len(runahead._spare) <= 2  # one thread at a time: no semaphore per thread
