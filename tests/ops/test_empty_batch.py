"""Empty (0-size) batches, every op, both modes, every call style (issue 17, item 4).

Each op either runs (an empty output of the right shape) or raises a ValueError naming the op
and the input.  Where MXNet fails before any operator runs (a bound graph, a hybridized block
that already ran a batch), the test runs a native op in the same place beside ours and asks for
the same failure: that one is MXNet's, and docs/troubleshooting.md says so.
"""

import contextlib

import mxnet as mx
import numpy as np
import pytest

import ops
from customop.dispatch import forced_path


def _z(*shape):
    return np.zeros(shape, np.float32)


# name: (inputs for a batch of b, params); the batch is the first axis of the first input.
CASES = {
    "focal_loss": (lambda b: [_z(b, 3, 4), _z(b, 3)], {}),
    "smooth_l1": (lambda b: [_z(b, 3), np.ones(1, np.float32)], {}),
    "wing_loss": (lambda b: [_z(b, 3), _z(b, 3)], {}),
    "softmax_ce": (lambda b: [_z(b, 3), _z(b)], {}),
    "center_loss": (lambda b: [_z(b, 2), _z(b), _z(2, 2)], dict(num_class=2)),
    "tile": (lambda b: [_z(b, 3)], dict(reps=2)),
    "topk": (lambda b: [_z(b, 5)], dict(k=2)),
    "arr_pick": (lambda b: [_z(b, 2, 5), np.ones((b, 1, 5), np.float32)], dict(num=2)),
    "box_iou": (lambda b: [_z(b, 4), _z(2, 4)], {}),
    "box_nms": (lambda b: [_z(b, 2, 6)], {}),
    "box_encode": (
        lambda b: [_z(b, 2), _z(b, 2), _z(b, 2, 4), _z(b, 2, 4), _z(4), np.ones(4, np.float32)],
        {},
    ),
    "box_decode": (lambda b: [_z(b, 2, 4), _z(1, 2, 4)], {}),
    "ohem_sampler": (lambda b: [_z(b, 4, 3), _z(b, 4), _z(b, 4)], {}),
}
NAMES = sorted(CASES)


def _op(name, mode):
    op = getattr(ops, name)
    return op.numpy if mode == "numpy" else op


def _outputs(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _first_input(op):
    return (op.signature.inputs if hasattr(op, "signature") else ("data",))[0]


def _refusal(name, op):
    return rf"customop 'ops\.{name}[^']*' \(input '{_first_input(op)}'\).*empty \(0-size\) batch"


def _good_call_works(op, name):
    make, params = CASES[name]
    for out in _outputs(op(*[mx.nd.array(a) for a in make(2)], **params)):
        assert out.shape[0] == 2 or name == "box_iou"
        out.wait_to_read()


def test_the_baseline_native_ops_refuse_an_empty_array_outside_a_graph():
    # Why 'mxnet'-mode forwards cannot run empty batches: MXNet's own operators refuse them.
    empty = mx.nd.array(_z(0, 3))
    for native in (mx.nd.relu, lambda x: x * 2, lambda x: x.sum(axis=1)):
        with pytest.raises(mx.base.MXNetError, match="inferring shapes failed"):
            native(empty).wait_to_read()


@pytest.mark.parametrize("how", ["direct", "function", "custom"])
@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
@pytest.mark.parametrize("name", NAMES)
def test_nd_call_on_an_empty_batch_runs_or_names_the_op_and_the_input(name, mode, how):
    op = _op(name, mode)
    make, params = CASES[name]
    xs = [mx.nd.array(a) for a in make(0)]
    want = [(0,) + o.shape[1:] for o in _outputs(op(*[mx.nd.array(a) for a in make(2)], **params))]
    if name == "box_iou":
        want = [(0, 2)]
    # A recorded call of an op with aux states goes through mx.nd.Custom ('custom') anyway.
    runs = mode == "numpy" and (how == "direct" or how == "function" and name != "center_loss")
    with forced_path(how):
        if runs:
            with mx.autograd.record() if how == "function" else contextlib.nullcontext():
                outs = _outputs(op(*xs, **params))
            assert [o.asnumpy().shape for o in outs] == want
        else:
            # 'mxnet' mode meets MXNet's refusal inside the forward; mx.nd.Custom (the 'custom'
            # path) hands us the 0 as "unknown" before any forward runs.
            with pytest.raises(ValueError, match=_refusal(name, op)):
                with mx.autograd.record() if how != "direct" else contextlib.nullcontext():
                    outs = op(*xs, **params)
                for o in _outputs(outs):
                    o.wait_to_read()
    _good_call_works(op, name)


def _symbol_inputs(name):
    make, params = CASES[name]
    n = 2 if name == "center_loss" else len(make(0))  # centers: the op's own auxiliary state
    return [f"in{i}" for i in range(n)], params


def _bind_error(sym, shapes):
    with pytest.raises(Exception) as info:
        exe = sym.simple_bind(mx.cpu(), **shapes)
        for out in exe.forward(is_train=False):
            out.wait_to_read()
    return info.value


@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
@pytest.mark.parametrize("name", NAMES)
def test_simple_bind_on_an_empty_batch_fails_as_for_a_native_op(name, mode):
    op = _op(name, mode)
    names, params = _symbol_inputs(name)
    shapes = {n: a.shape for n, a in zip(names, CASES[name][0](0))}
    native = _bind_error(mx.sym.relu(mx.sym.var("in0")), {"in0": shapes["in0"]})
    sym = op(*[mx.sym.var(n) for n in names], **params)
    ours = _bind_error(mx.sym.Group(_outputs(sym)), shapes)
    # MXNet's graph executor refuses the 0 before any operator runs, native ones alike.
    assert type(ours) is type(native), (ours, native)
    _good_call_works(op, name)


class _Block(mx.gluon.HybridBlock):
    def __init__(self, fn, **params):
        super().__init__()
        self.fn, self.params_ = fn, params

    def hybrid_forward(self, F, *xs):
        return self.fn(*xs, **self.params_)


class _CentersBlock(mx.gluon.HybridBlock):
    # center_loss as users hold it: the centers a Parameter of the block (as ops.CenterLoss)
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.centers = self.params.get("centers", shape=(2, 2), init="zeros", grad_req="null")

    def hybrid_forward(self, F, data, label, centers):
        return self.op(data, label, centers, num_class=2)


def _block(name, op):
    if name == "center_loss":
        block = _CentersBlock(op)
        block.initialize()
        return block, 2
    return _Block(op, **CASES[name][1]), len(CASES[name][0](0))


def _after_a_batch_error(block, good, empty):
    block.hybridize()
    for out in _outputs(block(*good)):
        out.wait_to_read()
    with pytest.raises(Exception) as info:
        for out in _outputs(block(*empty)):
            out.wait_to_read()
    for out in _outputs(block(*good)):  # and the block still works
        out.wait_to_read()
    return info.value


@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
@pytest.mark.parametrize("name", NAMES)
def test_a_hybridized_block_that_ran_a_batch_fails_on_an_empty_one_as_a_native_block(name, mode):
    op = _op(name, mode)
    block, n = _block(name, op)
    make = CASES[name][0]
    good = [mx.nd.array(a) for a in make(2)][:n]
    empty = [mx.nd.array(a) for a in make(0)][:n]
    native = _after_a_batch_error(
        _Block(lambda x: mx.sym.relu(x) if isinstance(x, mx.sym.Symbol) else mx.nd.relu(x)),
        good[:1],
        empty[:1],
    )
    ours = _after_a_batch_error(block, good, empty)
    assert type(ours) is type(native), (ours, native)
    assert "mem_plan" in str(native)
