"""Shape inference runs forwards on placeholders: it must leave the process's random streams
as it found them (issue 25 item 5)."""

import random

import mxnet as mx
import numpy as np
import pytest

from customop import customop


@customop("numpy")
def noisy_np(x):
    return x + np.random.uniform(size=x.shape) + random.random()


@customop("mxnet")
def noisy_nd(x):
    jitter = mx.nd.array(np.random.uniform(size=x.shape), ctx=x.context)
    return x + jitter + mx.nd.random.normal(shape=x.shape, ctx=x.context) + random.random()


class Noisy(mx.gluon.HybridBlock):
    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op

    def hybrid_forward(self, F, x):
        return self.op(x)


def _draws():
    return (
        np.random.uniform(size=3).tolist(),
        random.random(),
        mx.nd.random.uniform(shape=(3,)).asnumpy().tolist(),
    )


def _seed():
    np.random.seed(7)
    random.seed(7)
    mx.random.seed(7)


def _infer_shapes(op, how, shape):
    if how == "simple_bind":
        op(mx.sym.var("x")).simple_bind(mx.cpu(), x=shape)
    elif how == "Module":
        mod = mx.mod.Module(
            mx.sym.make_loss(op(mx.sym.var("x"))), data_names=["x"], label_names=None
        )
        mod.bind(data_shapes=[("x", shape)])
    else:  # a hybridized block's first call: MXNet's shape pass, then the forward itself
        net = Noisy(op)
        net.hybridize()
        net(mx.nd.ones(shape)).wait_to_read()


@pytest.mark.parametrize("how", ["simple_bind", "Module", "hybridized"])
@pytest.mark.parametrize("op", [noisy_np, noisy_nd], ids=lambda o: o.mode)
def test_shape_inference_leaves_the_random_streams_as_it_found_them(op, how):
    shape = (2, 3 + ["simple_bind", "Module", "hybridized"].index(how))  # a new signature
    if how == "hybridized":
        # the block's real forward draws, as any forward does: compare with a native block
        # that draws once from each stream the same way
        _seed()
        np.random.uniform(size=shape)
        random.random()
        want = _draws()
        _seed()
        _infer_shapes(op, how, shape)
        assert _draws() == want
        return
    _seed()
    want = _draws()
    _seed()
    _infer_shapes(op, how, shape)
    assert _draws() == want


def test_threads_drawing_meanwhile_lose_and_repeat_no_draw():
    # A loader thread's augmentations (issue 42 item 2): 4 threads draw from the global
    # np.random and random streams while this thread binds 200 new shapes of a 'numpy'-mode
    # op that draws in its forward.  Together the threads must have drawn exactly the first
    # values of the seeded streams: none repeated (a stream put back under them), none
    # skipped (the placeholders' draws taken from them).
    import threading

    np.random.seed(11)
    random.seed(11)
    stop = threading.Event()
    draws = [[] for _ in range(4)]

    def loop(mine):
        while not stop.is_set() and len(mine) < 200_000:
            mine.append((np.random.random_sample(), random.random()))

    threads = [threading.Thread(target=loop, args=(mine,)) for mine in draws]
    for t in threads:
        t.start()
    try:
        for n in range(1, 201):
            noisy_np(mx.sym.var("x")).simple_bind(mx.cpu(), x=(n, 7), grad_req="null")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    got_np = sorted(d[0] for mine in draws for d in mine)
    got_py = sorted(d[1] for mine in draws for d in mine)
    assert len(got_np) > 1000  # the threads drew while the binds ran
    seeded = np.random.RandomState(11)
    assert got_np == sorted(seeded.random_sample(len(got_np)).tolist())
    seeded_py = random.Random(11)
    assert got_py == sorted(seeded_py.random() for _ in got_py)


@customop("mxnet")
def _rows_sum(x, labels):
    return mx.nd.sum(x, axis=1) + labels.astype(x.dtype)


@pytest.mark.parametrize("label_dtype", ["float32", "int32"])
def test_a_new_signature_runs_the_forward_once_for_shapes_and_dtypes(monkeypatch, label_dtype):
    # MXNet's shape pass has no dtypes (the forward runs at guessed ones), then its type pass
    # asks at the graph's: where they are the guessed ones, that run answers both
    runs = []
    inference = _rows_sum.inference
    run = inference._run

    def counted(params, shapes, dtypes, seed=None):
        runs.append(dtypes)
        return run(params, shapes, dtypes, seed)

    monkeypatch.setattr(inference, "_run", counted)
    sym = _rows_sum(mx.sym.var("x"), mx.sym.var("labels"))
    rows = 3 if label_dtype == "float32" else 4  # (each parameter a signature of its own)
    _, outs, _ = sym.infer_shape(x=(rows, 5), labels=(rows,))
    _, types, _ = sym.infer_type(x="float32", labels=label_dtype)
    assert outs == [(rows,)] and types == [np.float32]
    assert runs[0] == (np.dtype("float32"),) * 2  # the shape pass's guess
    assert len(runs) == (1 if label_dtype == "float32" else 2)  # int32 labels: run again
