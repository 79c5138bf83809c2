"""User-style operators for the composition tests (importable by subprocesses: export/import).

Each is the kind of op a user writes: an output layer, an op with an aux state, a
two-output op, a ``'numpy'`` op with an automatic gradient, a generator without inputs.
``reference`` computes what a graph of them gives, from the formulas, in float64 NumPy.
"""

import autograd.numpy as anp
import mxnet as mx
import numpy as np

from customop import customop


@customop("numpy", need_top_grad=False, no_grad=("target",))
def l2_output(x, target):
    """An output layer: forwards x, its backward is the L2 loss gradient (head ignored)."""
    return x


l2_output.def_grad(lambda ans, x, target: lambda g: x - target)


@customop("mxnet", aux={"count": lambda x: (1,)})
def counted_double(x, count):
    """2x; counts its training forwards in an aux state."""
    if mx.autograd.is_training():
        count[:] = count + 1
    return 2 * x


@customop("mxnet")
def split_two(x):
    """Two outputs: x * 3 and x + 1 (automatic gradient)."""
    return x * 3, x + 1


@customop("numpy")
def cube_np(x):
    """x ** 3 with HIPS autograd's automatic gradient."""
    return anp.power(x, 3)


@customop("mxnet")
def ramp(n=4):
    """No array inputs: 0.5, 1.0, ... (n values), a constant row for the graph."""
    return (mx.nd.arange(n) + 1) * 0.5


def graph(F, x, target, label, feat, flabel, centers=None, count=None, reverse=False):
    """Every kind of node in one graph; each output is a loss (an output layer or make_loss).

    ``F`` is ``mx.nd`` or ``mx.sym``.  The aux states (``centers``, ``count``) are arrays
    with ``mx.nd`` (zeros when not given), left to MXNet with plain Symbols, Parameters in
    a Gluon block.  ``reverse`` creates the nodes in the opposite order (the outputs keep
    theirs).
    """
    from customop import ops

    if F is mx.nd:
        centers = mx.nd.zeros((3, 2)) if centers is None else centers
        count = mx.nd.zeros((1,)) if count is None else count
    aux_centers = () if centers is None else (centers,)
    aux_count = () if count is None else (count,)

    def two_outputs():
        first, second = split_two(x)
        return F.make_loss(F.sum(first * second))

    def generator():
        ramp_row = F.Custom(op_type=ramp.op_type, n=3)  # a node without inputs
        return F.make_loss(
            F.sum(F.broadcast_mul(counted_double(x, *aux_count), F.reshape(ramp_row, (1, 3))))
        )

    def smooth_l1():
        sigma = F.ones_like(F.slice_axis(x, axis=1, begin=0, end=1))
        return F.make_loss(F.sum(ops.smooth_l1(x - target, sigma)))  # weight left out

    builders = [
        lambda: l2_output(x, target),  # user output layer
        lambda: ops.softmax_ce(x, label),  # ours, need_top_grad=False
        two_outputs,
        smooth_l1,
        lambda: F.make_loss(F.sum(cube_np(x))),  # 'numpy' mode
        lambda: F.make_loss(F.sum(ops.center_loss(feat, flabel, *aux_centers, num_class=3))),
        lambda: F.make_loss(F.sum(ops.focal_loss.numpy(x, label))),  # a twin
        generator,  # aux state + generator
    ]
    order = list(range(len(builders)))[:: -1 if reverse else 1]
    made = {i: builders[i]() for i in order}
    return [made[i] for i in range(len(builders))]


def reference(x, target, label, feat, flabel):
    """d(sum of every loss)/d(x, feat), float64, from the formulas (zero centers)."""
    x, target, feat = (np.asarray(a, np.float64) for a in (x, target, feat))
    label = np.asarray(label).astype(int)
    n, c = x.shape
    onehot = np.eye(c)[label]
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    gx = x - target  # l2_output (head gradient ignored)
    gx = gx + (p - onehot)  # softmax_ce
    gx = gx + (3 * (x + 1) + 3 * x)  # d/dx sum(3x * (x + 1))
    d = x - target  # smooth_l1, sigma = 1
    gx = gx + np.where(np.abs(d) < 1, d, np.sign(d))
    gx = gx + 3 * x**2  # cube
    s = 1 / (1 + np.exp(-x))  # sigmoid focal loss, alpha .25, gamma 2
    pos = np.zeros_like(x)  # label l > 0 is a positive of channel l - 1; 0 is background
    rows = np.nonzero(label > 0)[0]
    pos[rows, label[rows] - 1] = 1
    gpos = -0.25 * (1 - s) ** 2 * (1 - s - 2 * s * np.log(s))
    gneg = -0.75 * s**2 * (2 * (1 - s) * np.log(1 - s) - s)
    npos = max((label > 0).sum(), 1)
    gx = gx + np.where(pos > 0, gpos, gneg) / npos
    gx = gx + 2 * np.arange(1, 4) * 0.5  # counted_double * ramp
    gfeat = feat.copy()  # center loss, zero centers: x - c
    return gx, gfeat
