"""One case of issue 52's table: a model trained under MXNet's AMP, our op against the same
computation in MXNet's own operators, in this process (``amp.init()`` patches MXNet
process-wide, so each case runs in a process of its own).

    python amp_case.py KIND PATH HYBRIDIZE [TARGET]

``KIND`` the op (see ``OPS``), ``PATH`` ``default`` or a ``forced_path``, ``HYBRIDIZE`` 0 or
1, ``TARGET`` AMP's dtype (``bfloat16``; ``float16``: MXNet's CPU FullyConnected has no
float16 kernel, so the dense layer stays float32 and its output is cast to float16 by
hand, as a GPU's AMP would hand it on).
Prints one JSON line: the dtypes our op received and returned, whether every gradient and
weight is finite, and the relative errors of the dense layer's weight gradient at step 1
and of its weights after ``STEPS`` steps.  Run by tests/customop/test_amp.py.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.contrib import amp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

KIND, PATH, HYBRIDIZE = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
TARGET = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
STEPS = 4
# float16 on CPU: FullyConnected has no float16 kernel there, so it stays off AMP's list
amp.init(target_dtype=TARGET, target_precision_ops=[] if TARGET == "float16" else None)

from customop import customop, ops, residuals  # noqa: E402
from customop.dispatch import forced_path  # noqa: E402

seen = []  # (dtype in, dtype out) of our op's forward


def _note(x, out):
    seen.append((str(np.dtype(x.dtype)), str(np.dtype(out.dtype))))
    return out


@customop("mxnet")
def cube_dg(x):
    return _note(x, x * x * x)


cube_dg.def_grad(lambda ans, x: lambda g: 3 * g * x * x)


@customop("mxnet")
def cube_auto(x):
    return _note(x, x * x * x)


@customop("mxnet")
def cube_res(x):
    sq = x * x
    return residuals(_note(x, sq * x), sq=sq)


cube_res.def_grad(lambda ans, x, sq: lambda g: 3 * g * sq)


@customop("numpy")
def cube_np(x):
    return _note(x, x * x * x)


cube_np.def_grad(lambda ans, x: lambda g: 3 * g * x * x)


@customop("numpy")
def cube_np_auto(x):  # differentiated by HIPS autograd
    return _note(x, x * x * x)


def focal_native(F, pred, label, alpha=0.25, gamma=2.0):
    # ops.focal_loss(pred, label) from its formula in MXNet's operators, in float32 as AMP's
    # lists compute MXNet's own losses (softmax_cross_entropy, smooth_l1: FP32_FUNCS)
    pred = F.amp_cast(pred, dtype="float32")
    target = F.one_hot(label - 1, 3)
    p = F.sigmoid(pred)
    log_p = -F.Activation(-pred, act_type="softrelu")
    log_1p = -F.Activation(pred, act_type="softrelu")
    loss = (
        -alpha * target * (1 - p) ** gamma * log_p - (1 - alpha) * (1 - target) * p**gamma * log_1p
    )
    valid = F.expand_dims(label != -1, axis=-1)
    return F.broadcast_div(F.broadcast_mul(loss, valid), F.maximum(F.sum(label > 0), 1))


# KIND -> (ours, MXNet's own operators), each F, dense output h, extra inputs -> loss terms
OPS = {
    "dg": (lambda F, h, *_: cube_dg(h), lambda F, h, *_: h * h * h),
    "auto": (lambda F, h, *_: cube_auto(h), lambda F, h, *_: h * h * h),
    "res": (lambda F, h, *_: cube_res(h), lambda F, h, *_: h * h * h),
    "numpy": (lambda F, h, *_: cube_np(h), lambda F, h, *_: h * h * h),
    "numpy_auto": (lambda F, h, *_: cube_np_auto(h), lambda F, h, *_: h * h * h),
    "losses": (
        lambda F, h, label, sigma: (
            F.sum(ops.focal_loss(F.reshape(h, (0, -1, 3)), label)) + F.sum(ops.smooth_l1(h, sigma))
        ),
        lambda F, h, label, sigma: (
            F.sum(focal_native(F, F.reshape(h, (0, -1, 3)), label))
            + F.sum(F.smooth_l1(h, scalar=2.0))
        ),
    ),
}


class Net(gluon.HybridBlock):
    def __init__(self, head, **kwargs):
        super().__init__(**kwargs)
        self.head = head
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, in_units=5)

    def hybrid_forward(self, F, x, label, sigma):
        h = self.dense(x)
        if TARGET == "float16":  # what a GPU's AMP hands on; CPU's keeps float32
            h = F.amp_cast(h, dtype="float16")
        return self.head(F, h, label, sigma)


def train(head, path):
    mx.random.seed(0)
    net = Net(head, prefix="net_")
    net.initialize(mx.init.Xavier(), force_reinit=True)
    if HYBRIDIZE:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    amp.init_trainer(trainer)
    rng = np.random.RandomState(1)
    x = mx.nd.array(rng.uniform(-1, 1, (4, 5)))
    label = mx.nd.array(rng.randint(-1, 4, (4, 2)))
    sigma = mx.nd.array([2.0])
    grads = []
    with forced_path(None if path == "default" else path):
        for _ in range(STEPS):
            with autograd.record():
                loss = net(x, label, sigma).sum()
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            scale = trainer._amp_loss_scaler.loss_scale
            grads.append(net.dense.weight.grad().astype("float32").asnumpy() / scale)
            trainer.step(1)
    return grads, net.dense.weight.data().asnumpy()


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


ours, native = OPS[KIND]
g_ours, w_ours = train(ours, PATH)
g_ref, w_ref = train(native, "default")
finite = [bool(np.isfinite(g).all()) for g in g_ours]
ref_finite = [bool(np.isfinite(g).all()) for g in g_ref]
both = [i for i in range(STEPS) if finite[i] and ref_finite[i]]
print(
    json.dumps(
        {
            "seen": sorted(set(seen)),
            "finite": finite,  # by step: AMP's first float16 steps may overflow, MXNet's alike
            "ref_finite": ref_finite,
            "weights_finite": bool(np.isfinite(w_ours).all()),
            "grad": rel(g_ours[both[0]], g_ref[both[0]]) if both else None,
            "weight": rel(w_ours, w_ref),
        }
    )
)
