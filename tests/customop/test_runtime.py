"""We are a guest: importing changes nothing, and what an op needs is installed when it is used.

See ``customop/runtime/`` for the list of patches.
"""

import sys
import textwrap
from pathlib import Path

import pytest

from tests import concurrently, fresh

ROOT = Path(__file__).resolve().parents[2]

# Every MXNet / Python object customop has ever had a reason to touch, by identity.
SNAPSHOT = textwrap.dedent("""
    import atexit, json, subprocess, sys, threading
    import mxnet as mx
    from mxnet._ffi._ctypes import function as ffi_function

    def snapshot():
        objects = {
            "base.get_last_ffi_error": mx.base.get_last_ffi_error,
            "ffi.get_last_ffi_error": ffi_function.get_last_ffi_error,
            "operator.register": mx.operator.register,
            "operator.print": mx.operator.__dict__.get("print"),
            "autograd.print": mx.autograd.__dict__.get("print"),
            "autograd.backward": mx.autograd.backward,
            "NDArray.backward": mx.nd.NDArray.backward,
            "Executor.__init__": mx.executor.Executor.__init__,
            "Executor.forward": mx.executor.Executor.forward,
            "Executor.backward": mx.executor.Executor.backward,
            "CachedOp.__init__": mx.nd.CachedOp.__init__,
            "CachedOp.__call__": mx.nd.CachedOp.__call__,
            "Symbol.bind": mx.sym.Symbol.bind,
            "Symbol.simple_bind": mx.sym.Symbol.simple_bind,
            "Symbol.infer_shape": mx.sym.Symbol.infer_shape,
            "NDArray.asnumpy": mx.nd.NDArray.asnumpy,
            "register._imperative_invoke": mx.ndarray.register._imperative_invoke,
            "RecordingStateScope.__enter__": mx.autograd._RecordingStateScope.__enter__,
            "RecordingStateScope.__exit__": mx.autograd._RecordingStateScope.__exit__,
            "Trainer.step": mx.gluon.Trainer.step,
            "Trainer.allreduce_grads": mx.gluon.Trainer.allreduce_grads,
            "Trainer.update": mx.gluon.Trainer.update,
            "Module.update": mx.mod.Module.update,
            "Popen._execute_child": subprocess.Popen._execute_child,
            "sys.excepthook": sys.excepthook,
            "Thread.isAlive": getattr(threading.Thread, "isAlive", None),
        }
        state = {k: id(v) for k, v in objects.items()}
        state["atexit callbacks"] = atexit._ncallbacks()
        return state
""")


# what a process that bound a graph of our ops has installed
BOUND = {
    "backlog",
    "binds",
    "deps",
    "errors",
    "fork",
    "gluonshape",
    "names",
    "release",
    "runahead",
    "shapes",
}


def _run(code, env=None):
    import os

    return fresh.run_json(
        [sys.executable, "-c", SNAPSHOT + textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_importing_customop_and_ops_changes_nothing():
    result = _run("""
        before = snapshot()
        import customop, ops, customop.check, customop.distributed.auxsync
        import numpy as np
        # defining ops, calling them on NumPy arrays and on NDArrays outside record() is not
        # a use of any MXNet machinery either
        ops.wing_loss.numpy(np.ones(3, np.float32), np.zeros(3, np.float32), w=10.0, epsilon=2.0)
        ops.focal_loss(mx.nd.zeros((2, 3)), mx.nd.array([0, 1]), alpha=0.25, gamma=2.0)
        after = snapshot()
        from customop import runtime
        print(json.dumps({"changed": sorted(k for k in before if before[k] != after[k]),
                          "installed": runtime.installed()}))
    """)
    assert result == {"changed": [], "installed": []}


def test_the_first_recorded_call_installs_only_what_it_needs():
    result = _run("""
        before = snapshot()
        import customop, ops
        x = mx.nd.ones((2, 3)); x.attach_grad()
        with mx.autograd.record():
            loss = ops.focal_loss(x, mx.nd.array([0, 1]), alpha=0.25, gamma=2.0)
        loss.backward()
        from customop import runtime
        after = snapshot()
        print(json.dumps({"changed": sorted(k for k in before if before[k] != after[k]),
                          "installed": runtime.installed()}))
    """)
    assert result["installed"] == ["backlog", "errors", "fork", "runahead"]
    # the error hook and the exit drain; the aux patch is not there (no aux op was used)
    assert set(result["changed"]) <= {
        "base.get_last_ffi_error",
        "ffi.get_last_ffi_error",
        "operator.print",
        "autograd.print",
        "atexit callbacks",
        "Popen._execute_child",
    }
    assert "Executor.__init__" not in result["changed"]
    assert "autograd.backward" not in result["changed"]
    assert "Trainer.step" not in result["changed"] and "Module.update" not in result["changed"]


def test_switched_off_patches_stay_out():
    result = _run(
        """
        import customop, ops
        x = mx.nd.ones((2, 3))
        with mx.autograd.record():
            ops.focal_loss(x, mx.nd.array([0, 1]), alpha=0.25, gamma=2.0).wait_to_read()
        from customop import runtime
        print(json.dumps({"installed": runtime.installed()}))
    """,
        env={"CUSTOMOP_RUNTIME_OFF": "fork,errors,backlog,runahead"},
    )
    assert result == {"installed": []}


UNRELATED_NETS = """
    import customop, ops
    from customop import runtime
    CTX = [mx.cpu(0), mx.cpu(1)]

    def hybrid_net():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Dense(2))
        net.initialize(mx.init.Xavier(), ctx=mx.cpu())
        net.hybridize()
        net(mx.nd.ones((4, 5)))
        return net

    def executor():
        x = mx.sym.var("x")
        return mx.sym.FullyConnected(x, num_hidden=3).simple_bind(mx.cpu(), x=(4, 5))
"""


def test_after_an_aux_op_is_used_only_its_own_graphs_wait():
    result = _run(
        textwrap.dedent(UNRELATED_NETS)
        + textwrap.dedent("""
        # an op with aux states, used in every style
        data = mx.nd.random.normal(shape=(4, 3)); label = mx.nd.array([0, 1, 0, 1])
        data.attach_grad()
        loss = ops.CenterLoss(num_class=2, feature_dim=3, alpha=0.5)
        loss.initialize()
        loss.hybridize()
        with mx.autograd.record():
            l = loss(data, label)
        l.backward()
        centers_sym = ops.center_loss(mx.sym.var("x"), mx.sym.var("y"), num_class=2, name="cl")
        aux_exe = centers_sym.simple_bind(mx.cpu(), x=(4, 3), y=(4,))
        net, exe = hybrid_net(), executor()
        print(json.dumps({
            "installed": runtime.installed(),
            "aux executor": type(aux_exe).__name__,
            "aux cachedop": type(loss._cached_op).__name__,
            "unrelated executor": type(exe).__name__,
            "unrelated cachedop": type(net._cached_op).__name__,
        }))
    """)
    )
    assert result == {
        "installed": sorted(BOUND | {"aux", "auxsync"}),
        "aux executor": "_AuxExecutor",
        "aux cachedop": "_AuxCachedOp",
        "unrelated executor": "Executor",
        "unrelated cachedop": "CachedOp",
    }


def test_the_inline_patch_comes_with_the_first_graph_of_an_op_that_inlines():
    result = _run(
        textwrap.dedent(UNRELATED_NETS)
        + textwrap.dedent("""
        before = snapshot()
        d = mx.nd.ones((1, 4, 4)); d.attach_grad()
        with mx.autograd.record():  # recorded as its own operators: no graph, no patch
            ops.box_decode(d, mx.nd.ones((1, 4, 4))).backward()
        steps = [runtime.installed()]
        ops.topk.numpy(mx.sym.var("x"), k=2)  # 'numpy' mode: it never inlines
        steps.append(runtime.installed())
        out = ops.box_decode(mx.sym.var("d"), mx.sym.var("a"))
        steps.append(runtime.installed())
        changed = sorted(k for k in before if before[k] != snapshot()[k])
        exe = out.simple_bind(mx.cpu(), d=(2, 4, 4), a=(1, 4, 4))
        net, plain = hybrid_net(), executor()
        print(json.dumps({"steps": steps, "changed": changed,
                          "inlined": hasattr(exe, "customop_inlined"),
                          "unrelated executor": hasattr(plain, "customop_inlined"),
                          "unrelated cachedop": type(net._cached_op).__name__,
                          "trace hooks back": snapshot()["NDArray.asnumpy"] == before[
                              "NDArray.asnumpy"]}))
    """)
    )
    assert ["inline" in step for step in result["steps"]] == [False, False, True]
    assert {"Symbol.bind", "Symbol.simple_bind", "CachedOp.__init__"} <= set(result["changed"])
    assert ["gluonshape" in step for step in result["steps"]] == [False, True, True]
    assert "Executor.__init__" not in result["changed"]
    assert result["inlined"] and result["trace hooks back"]
    assert not result["unrelated executor"] and result["unrelated cachedop"] == "CachedOp"


def test_switched_off_inlining_keeps_custom_nodes():
    result = _run(
        """
        import customop, ops
        from customop import runtime
        out = ops.box_decode(mx.sym.var("d"), mx.sym.var("a"))
        exe = out.simple_bind(mx.cpu(), d=(2, 4, 4), a=(1, 4, 4))
        print(json.dumps({"installed": runtime.installed(),
                          "inlined": hasattr(exe, "customop_inlined")}))
    """,
        env={"CUSTOMOP_RUNTIME_OFF": "inline"},
    )
    assert "inline" not in result["installed"] and not result["inlined"]


RELEASE = """
    import gc, time, weakref
    import customop
    from customop import runtime
    from customop.dispatch import forced_path

    made = []  # MXNet's own kind of operator, written by hand

    class Plain(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            self.assign(out_data[0], req[0], 2 * in_data[0])

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            self.assign(in_grad[0], req[0], 2 * out_grad[0])

    @mx.operator.register("test_runtime_plain")
    class PlainProp(mx.operator.CustomOpProp):
        def create_operator(self, ctx, shapes, dtypes):
            op = Plain()
            made.append(weakref.ref(op))
            return op

    @customop.customop("numpy", name="test_runtime.double")
    def double(x):
        return customop.residuals(2 * x, kept=x)

    double.def_grad(lambda ans, x, kept: lambda g: 2 * g)
    kept = []
    registry = mx.operator._registry.ref_holder
    gc.collect(); gc.disable()
    before = len(registry)
    x = mx.nd.ones(3); x.attach_grad()
    with mx.autograd.record():
        plain = [mx.nd.Custom(x, op_type="test_runtime_plain") for _ in range(5)]
    with forced_path("custom"), mx.autograd.record():
        ours = [double(x) for _ in range(5)]
    mx.nd.waitall()
    del plain, ours
    mx.nd.waitall()
    deadline = time.monotonic() + 5  # MXNet deletes operators on its own threads
    while len(registry) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"installed": runtime.installed(), "left in registry": len(registry) - before,
                      "watched": len(runtime.callbacks.watched),
                      "hand-written alive": sum(r() is not None for r in made)}))
"""


@pytest.fixture(scope="module")
def releases(request):
    """RELEASE run once per selected CUSTOMOP_RUNTIME_OFF, two processes at a time."""
    runs = concurrently.run_selected(
        {
            off: lambda off=off: _run(RELEASE, env={"CUSTOMOP_RUNTIME_OFF": off})
            for off in concurrently.selected(request, "off")
        }
    )
    yield runs
    runs.wait()


@pytest.mark.parametrize("off", ["", "release", "deps", "release,deps"])
def test_release_frees_only_our_operators_and_mxnet_still_deletes_them(off, releases):
    result = releases[off]
    # MXNet's own deleter ran for every operator (ours through the release hook), and a
    # hand-written CustomOp is left to the cycle collector, as MXNet leaves it
    installed = sorted(BOUND - set(off.split(",")))
    assert result == {
        "installed": installed,
        "left in registry": 0,
        "watched": 0,
        "hand-written alive": 5,
    }


NATIVE_LOOP = """
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x = mx.nd.random.normal(shape=(8, 5)); y = mx.nd.array([0, 1, 2, 0, 1, 2, 0, 1])
    ce = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(5):
        with mx.autograd.record():
            l = ce(net(x), y)
        l.backward()
        trainer.step(8)
    print(json.dumps([float(v) for v in net(x).asnumpy().ravel()]))
"""


AUX_OP_USED = """
import customop, ops
c, x = mx.nd.zeros((2, 3)), mx.nd.ones((2, 3))
x.attach_grad()
with mx.autograd.record():
    l = ops.center_loss(x, mx.nd.array([0, 1]), c, num_class=2)
l.backward()
"""


@pytest.fixture(scope="module")
def native_loops(request):
    """The loop without customop (key None), then after each selected setup; two at a time."""
    setups = concurrently.selected(request, "setup")
    jobs = {None: lambda: _run(NATIVE_LOOP)} if setups else {}
    jobs.update({s: lambda s=s: _run(s + textwrap.dedent(NATIVE_LOOP)) for s in setups})
    runs = concurrently.run_selected(jobs)
    yield runs
    runs.wait()


@pytest.mark.parametrize("setup", ["import customop, ops\n", AUX_OP_USED])
def test_a_native_training_loop_gives_the_same_numbers(setup, native_loops):
    assert native_loops[setup] == native_loops[None]


def test_mxnets_fork_steps_that_the_fork_patch_runs_are_exported():
    # The fork patch calls two internal, C++-mangled functions of libmxnet.so (see
    # customop/runtime/fork.py): a build of MXNet without them must fail here, loudly.
    from mxnet.base import _LIB

    from customop import runtime

    missing = [name for name in runtime.MXNET_FORK_STEPS if not hasattr(_LIB, name)]
    assert missing == [], f"libmxnet.so no longer exports {missing}: the fork patch cannot run"


def test_the_design_page_names_every_switch():
    # docs/design.md's CUSTOMOP_RUNTIME_OFF list and its table: every patch of the index,
    # and only those (excepthook, the launcher's, has a row but no switch)
    import re

    from customop import runtime

    page = (ROOT / "docs" / "design.md").read_text()
    (listed,) = re.findall(r"`CUSTOMOP_RUNTIME_OFF=([\w,]+)`", page)
    assert sorted(listed.split(",")) == sorted(runtime.PATCHES)
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    assert rows == set(runtime.PATCHES) | {"excepthook"}
