"""Data-parallel training with decorated losses on MXNet's kvstore: one process or a dist_sync job.

A two-layer net on synthetic data (fixed seed) learns 3 classes with a
decorated softmax cross-entropy (``'numpy'`` mode) and, with
``--center-loss W``, the library's center loss on the hidden features
(:class:`customop.ops.CenterLoss` in Gluon, :func:`customop.ops.center_loss` on symbols, with
``scale=W``), whose class centers are an auxiliary state: ``Trainer.step`` and
``Module.update`` (so ``fit``) keep them identical on every device and worker, with
no call of ours (``--aux-sync`` adds the explicit
:class:`customop.distributed.auxsync.AuxSync` call for comparison).  Each step uses a global
batch of ``--batch`` rows, cut into one shard per device of the job: every worker
takes its devices' shards, so the summed gradients are those of the whole batch,
and 2 workers with 1 device each see exactly what 1 process with 2 devices sees.
``--focal-loss W`` (Gluon) adds :func:`customop.ops.focal_loss` on the logits, an
``'mxnet'``-mode op that runs as MXNet's own operators in a hybridized graph.

One process::

    python examples/dist_train.py --api gluon --kvstore local --out /tmp/run

Two workers and one server on 127.0.0.1::

    python -m customop.distributed.launch -n 2 -s 1 --launcher local \\
        python examples/dist_train.py --api gluon --kvstore dist_sync --out /tmp/run

Two Horovod ranks (Gloo, one device each; ``hvd.DistributedTrainer`` in Gluon,
``hvd.DistributedOptimizer`` in Module), the same shards::

    horovodrun --gloo -np 2 -H localhost:2 --network-interface lo \\
        python examples/dist_train.py --api gluon --horovod --center-loss 0.1 --out /tmp/run

Each worker writes ``<out>/<api>-rank<r>.npz``: every parameter's copy on every
device (``<name>@<device index>``).
"""

from __future__ import annotations

import argparse
import os

import mxnet as mx
import numpy as np

from customop import customop, ops
from customop.distributed.auxsync import AuxSync

NUM_CLASS, DIM, HIDDEN = 3, 6, 8


@customop("numpy")
def softmax_xent(pred, label):
    r"""Per-sample softmax cross-entropy :math:`-\log \mathrm{softmax}(pred_i)_{label_i}`."""
    if not ((label >= 0) & (label < pred.shape[1])).all():
        raise ValueError(
            f"softmax_xent: label has values outside [0, {pred.shape[1]}): "
            f"{np.unique(label[(label < 0) | (label >= pred.shape[1])])}"
        )
    logp = pred - pred.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(label)), label.astype(np.int64)]


def _xent_grad(ans, pred, label):
    def grad(g):
        p = np.exp(pred - pred.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(label)), label.astype(np.int64)] -= 1
        return g[:, None] * p

    return grad


softmax_xent.def_grad(_xent_grad)
softmax_xent.def_grad(lambda ans, pred, label: lambda g: np.zeros_like(label), argnum=1)


def make_data(steps, batch):
    rng = np.random.RandomState(42)
    n = steps * batch
    label = rng.randint(0, NUM_CLASS, size=n)
    means = rng.normal(size=(NUM_CLASS, DIM)) * 2
    x = (means[label] + rng.normal(size=(n, DIM))).astype(np.float32)
    return x, label.astype(np.float32)


class Net(mx.gluon.HybridBlock):
    def __init__(self, center_weight, focal_weight=0.0, **kwargs):
        super().__init__(**kwargs)
        self.focal_weight = focal_weight
        with self.name_scope():
            self.body = mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=DIM)
            self.head = mx.gluon.nn.Dense(NUM_CLASS, in_units=HIDDEN)
            # Owns the centers: Parameter net_center_centers (aux state, grad_req='null').
            self.center = (
                ops.CenterLoss(NUM_CLASS, HIDDEN, scale=center_weight, prefix="center_")
                if center_weight
                else None
            )

    def hybrid_forward(self, F, x, label):
        feat = self.body(x)
        logits = self.head(feat)
        loss = softmax_xent(logits, label)
        if self.focal_weight:  # the library's focal loss: native operators when hybridized
            focal = ops.focal_loss(logits, label, normalization="none")  # per-row: exact
            loss = loss + self.focal_weight * F.sum(focal, axis=1)
        if self.center is not None:  # scale/2 * |feat - c_label|^2; backward moves the centers
            loss = loss + self.center(feat, label)
        return loss


def train_gluon(args, kv, ctxs, x, y):
    net = Net(args.center_loss, args.focal_loss, prefix="net_")  # the same names everywhere
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if args.hybridize:
        net.hybridize()
    if isinstance(kv, Ranks):  # Horovod: rank 0's initial values everywhere, centers too
        kv.hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        # Horovod averages the gradients over the ranks: divide by this rank's share
        trainer = kv.hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": args.lr})
        return _gluon_loop(args, kv, net, trainer, ctxs, x, y, args.batch // kv.num_workers)
    dist = kv is not None and "dist" in kv.type
    # dist_* with aux states: the servers only sum (the center deltas must not go through
    # the optimizer). Without, MXNet's default: its first step with update_on_kvstore=False
    # can start a worker from the summed gradient (see customop.aux_merge).
    on_kv = False if dist and args.center_loss and not args.update_on_kvstore else None
    trainer = mx.gluon.Trainer(
        net.collect_params(),
        "sgd",
        {"learning_rate": args.lr},
        kvstore=kv if kv is not None else "device",
        update_on_kvstore=on_kv,
    )
    return _gluon_loop(args, kv, net, trainer, ctxs, x, y, args.batch)


def _gluon_loop(args, kv, net, trainer, ctxs, x, y, batch):
    sync = AuxSync([net.center.centers], trainer) if args.center_loss and args.aux_sync else None
    for rows in _batches(args, kv, x):
        xs = mx.gluon.utils.split_and_load(mx.nd.array(x[rows]), ctxs)
        ys = mx.gluon.utils.split_and_load(mx.nd.array(y[rows]), ctxs)
        with mx.autograd.record():
            losses = [net(a, b) for a, b in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(batch)  # the global batch: workers' gradients are summed
        if sync:
            sync()
    return {name: p.list_data() for name, p in net.collect_params().items()}


def train_module(args, kv, ctxs, x, y):
    data, label = mx.sym.var("data"), mx.sym.var("label")
    feat = mx.sym.Activation(
        mx.sym.FullyConnected(data, num_hidden=HIDDEN, name="body"), act_type="relu"
    )
    loss = softmax_xent(mx.sym.FullyConnected(feat, num_hidden=NUM_CLASS, name="head"), label)
    if args.center_loss:
        # Aux state center_centers, created by MXNet (zeros) and saved with the aux params.
        loss = loss + ops.center_loss(
            feat, label, num_class=NUM_CLASS, scale=args.center_loss, name="center"
        )
    if kv is not None and "dist" in kv.type and args.center_loss and not args.update_on_kvstore:
        os.environ["MXNET_UPDATE_ON_KVSTORE"] = "0"  # servers only sum (see Gluon above)
    mod = mx.mod.Module(
        mx.sym.MakeLoss(loss), data_names=["data"], label_names=["label"], context=ctxs
    )
    local = args.batch // (kv.num_workers if kv is not None else 1)
    mod.bind(data_shapes=[("data", (local, DIM))], label_shapes=[("label", (local,))])
    mod.init_params(mx.init.Xavier())
    # Module divides by batch * num_workers itself (rescale_grad).
    opt = dict(
        kvstore=kv if kv is not None else "device", optimizer_params={"learning_rate": args.lr}
    )
    if isinstance(kv, Ranks):  # Horovod: rank 0's initial values, gradients averaged
        arg_params, aux_params = mod.get_params()
        kv.hvd.broadcast_parameters(arg_params, root_rank=0)
        kv.hvd.broadcast_parameters(aux_params, root_rank=0)
        mod.set_params(arg_params, aux_params)
        sgd = mx.optimizer.SGD(learning_rate=args.lr, rescale_grad=1.0 / local)
        opt = dict(kvstore=None, optimizer=kv.hvd.DistributedOptimizer(sgd))
    if args.fit:  # the same batches, in order, through fit()
        rows = np.concatenate(list(_batches(args, kv, x)))
        mod.fit(
            mx.io.NDArrayIter(x[rows], y[rows], batch_size=local),
            num_epoch=1,
            eval_metric="loss",
            **opt,
        )
    else:
        mod.init_optimizer(**opt)
        sync = AuxSync(mod) if args.center_loss and args.aux_sync else None
        for rows in _batches(args, kv, x):
            mod.forward_backward(mx.io.DataBatch([mx.nd.array(x[rows])], [mx.nd.array(y[rows])]))
            mod.update()
            if sync:
                sync()
    group = mod._exec_group
    out = {n: arrs for n, arrs in zip(group.param_names, group.param_arrays)}
    out.update({n: arrs for n, arrs in zip(group.aux_names, group.aux_arrays)})
    return out


class Ranks:
    """A Horovod job's rank and size, where the loops read a kvstore's."""

    def __init__(self, hvd):
        self.hvd, self.rank, self.num_workers, self.type = hvd, hvd.rank(), hvd.size(), "horovod"


def _batches(args, kv, x):
    # The global batch is cut into one shard per device of the job (rows s::shards); each
    # worker takes its devices' shards in order, so 2 workers x 1 device see what 1 process
    # x 2 devices sees.
    rank, workers = (kv.rank, kv.num_workers) if kv is not None else (0, 1)
    shards = workers * args.contexts
    for step in range(args.steps):
        rows = np.arange(step * args.batch, (step + 1) * args.batch)
        rows = np.concatenate(
            [rows[s::shards] for s in range(rank * args.contexts, (rank + 1) * args.contexts)]
        )
        if args.fail_rank == rank and step == 1:
            # A decorated op that fails on bad input in one worker: the launcher ends the job.
            softmax_xent(mx.nd.zeros((2, NUM_CLASS)), mx.nd.array([0, NUM_CLASS + 4]))
        yield rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["gluon", "module"], default="gluon")
    parser.add_argument(
        "--kvstore", default="local", help="local, device, dist_sync, ... or none (no kvstore)"
    )
    parser.add_argument("--contexts", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16, help="global batch (all workers)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--center-loss", type=float, default=0.0, help="its weight (0: off)")
    parser.add_argument(
        "--focal-loss",
        type=float,
        default=0.0,
        help="Gluon: add ops.focal_loss (no normalization) with this weight",
    )
    parser.add_argument("--hybridize", action="store_true")
    parser.add_argument("--fit", action="store_true", help="Module: train with fit()")
    parser.add_argument(
        "--aux-sync",
        action="store_true",
        help="also call AuxSync after every step (not needed with these loops)",
    )
    parser.add_argument(
        "--update-on-kvstore",
        action="store_true",
        help="dist_*: run the optimizer on the servers (aux states then warn)",
    )
    parser.add_argument(
        "--fail-rank",
        type=int,
        default=-1,
        help="this worker feeds a bad label at step 1 (tests fail-fast)",
    )
    parser.add_argument(
        "--horovod", action="store_true", help="a rank of a horovodrun job (instead of --kvstore)"
    )
    parser.add_argument("--out", default=None, help="directory for <api>-rank<r>.npz")
    args = parser.parse_args(argv)
    mx.random.seed(0)
    np.random.seed(0)
    if args.horovod:
        import horovod.mxnet as hvd

        hvd.init()
        kv, args.kvstore = Ranks(hvd), "horovod"
        # each rank draws its own initial values, as on separate machines:
        # hvd.broadcast_parameters makes them rank 0's (the seed one process uses)
        mx.random.seed(hvd.rank())
    else:
        kv = None if args.kvstore == "none" else mx.kv.create(args.kvstore)
    ctxs = [mx.cpu(i) for i in range(args.contexts)]
    x, y = make_data(args.steps, args.batch)
    train = train_gluon if args.api == "gluon" else train_module
    params = train(args, kv, ctxs, x, y)
    rank = kv.rank if kv is not None else 0
    values = {
        f"{name}@{i}": a.asnumpy() for name, arrs in params.items() for i, a in enumerate(arrs)
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"{args.api}-rank{rank}.npz"), **values)
    print(
        f"rank {rank}: trained {len(params)} parameters for {args.steps} steps on {args.kvstore}",
        flush=True,
    )
    return values


if __name__ == "__main__":
    main()
