"""We are a guest: importing changes nothing, and what an op needs is installed when it is used.

See ``customop/runtime.py`` for the list of patches.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every MXNet / Python object customop has ever had a reason to touch, by identity.
SNAPSHOT = textwrap.dedent('''
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
''')


def _run(code, env=None):
    import os

    out = subprocess.run([sys.executable, "-c", SNAPSHOT + textwrap.dedent(code)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_customop_and_ops_changes_nothing():
    result = _run('''
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
    ''')
    assert result == {"changed": [], "installed": []}


def test_the_first_recorded_call_installs_only_what_it_needs():
    result = _run('''
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
    ''')
    assert result["installed"] == ["errors", "fork"]
    # the error hook and the exit drain; the aux patch is not there (no aux op was used)
    assert set(result["changed"]) <= {"base.get_last_ffi_error", "ffi.get_last_ffi_error",
                                      "operator.print", "autograd.print", "atexit callbacks",
                                      "Popen._execute_child"}
    assert "Executor.__init__" not in result["changed"]
    assert "autograd.backward" not in result["changed"]
    assert "Trainer.step" not in result["changed"] and "Module.update" not in result["changed"]


def test_switched_off_patches_stay_out():
    result = _run('''
        import customop, ops
        x = mx.nd.ones((2, 3))
        with mx.autograd.record():
            ops.focal_loss(x, mx.nd.array([0, 1]), alpha=0.25, gamma=2.0).wait_to_read()
        from customop import runtime
        print(json.dumps({"installed": runtime.installed()}))
    ''', env={"CUSTOMOP_RUNTIME_OFF": "fork,errors"})
    assert result == {"installed": []}


UNRELATED_NETS = '''
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
'''


def test_after_an_aux_op_is_used_only_its_own_graphs_wait():
    result = _run(textwrap.dedent(UNRELATED_NETS) + textwrap.dedent('''
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
    '''))
    assert result == {"installed": ["aux", "auxsync", "errors", "fork"],
                      "aux executor": "_AuxExecutor", "aux cachedop": "_AuxCachedOp",
                      "unrelated executor": "Executor", "unrelated cachedop": "CachedOp"}


NATIVE_LOOP = '''
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
'''


AUX_OP_USED = """
import customop, ops
c, x = mx.nd.zeros((2, 3)), mx.nd.ones((2, 3))
x.attach_grad()
with mx.autograd.record():
    l = ops.center_loss(x, mx.nd.array([0, 1]), c, num_class=2)
l.backward()
"""


@pytest.mark.parametrize("setup", ["import customop, ops\n", AUX_OP_USED])
def test_a_native_training_loop_gives_the_same_numbers(setup):
    plain = _run(NATIVE_LOOP)
    assert _run(setup + textwrap.dedent(NATIVE_LOOP)) == plain
