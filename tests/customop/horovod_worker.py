"""One rank of a Horovod job (one device) training ``auxops.merged``, whose states follow every
merge rule: ``hvd.DistributedTrainer`` imperatively and hybridized, a plain Trainer with
``AuxSync(..., hvd)``, and Module with ``hvd.DistributedOptimizer``; writes every state to
``<out>/rank<r>.npz`` as ``<run>/<state>``.  ``--forget``: the plain Trainer without the
AuxSync call (its next training pass raises AuxStateError).

Run by tests/test_horovod.py under tests/horovodrun.py.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import horovod.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from customop.distributed.auxsync import AuxSync  # noqa: E402
from tests.customop.aux_rules_worker import DIM, ROWS, shards  # noqa: E402
from tests.customop.auxops import RULE_STATES, MergedBlock, merged  # noqa: E402


def gluon(data, rank, hybridize, by_hand=False, forget=False):
    net = MergedBlock(DIM, prefix="net_")
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    if by_hand:  # gradients allreduced by hand, as some scripts do; states by AuxSync
        trainer = mx.gluon.Trainer(
            net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=None
        )
        sync = None if forget else AuxSync([getattr(net, n) for n in RULE_STATES], hvd)
    else:
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        sync = None
    for step in data:
        x = mx.nd.array(step[rank])
        x.attach_grad()  # merged's backward (which moves its states) runs for it
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        if by_hand:
            for i, p in enumerate(net.collect_params().values()):
                if p.grad_req != "null":
                    hvd.allreduce_(p.grad(), name=f"grad{i}", op=hvd.Average)
        trainer.step(ROWS)
        if sync is not None:
            sync()
    return {name: getattr(net, name).data() for name in RULE_STATES}


def module(data, rank):
    out = mx.sym.FullyConnected(merged(mx.sym.var("data"), name="m"), num_hidden=DIM, name="fc")
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(out)), data_names=["data"], label_names=None, context=[mx.cpu()]
    )
    mod.bind(data_shapes=[("data", (ROWS, DIM))], inputs_need_grad=True)
    mod.init_params(mx.init.Xavier())
    sgd = mx.optimizer.SGD(learning_rate=0.01, rescale_grad=1.0 / ROWS)
    mod.init_optimizer(kvstore=None, optimizer=hvd.DistributedOptimizer(sgd))
    for step in data:
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(step[rank])]))
        mod.update()
    group = mod._exec_group
    return {name: group.aux_arrays[group.aux_names.index(f"m_{name}")][0] for name in RULE_STATES}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--forget", action="store_true")
    args = parser.parse_args(argv)
    hvd.init()
    rank = hvd.rank()
    data = shards(1)  # [step][copy]: two copies, one a rank
    assert len(data[0]) == hvd.size() == 2
    if args.forget:
        gluon(data, rank, hybridize=False, by_hand=True, forget=True)
        return
    saved = {}
    runs = {
        "gluon": lambda: gluon(data, rank, False),
        "gluon-hybridized": lambda: gluon(data, rank, True),
        "by_hand": lambda: gluon(data, rank, True, by_hand=True),
        "module": lambda: module(data, rank),
    }
    for run, train in runs.items():
        for name, value in train().items():
            saved[f"{run}/{name}"] = value.asnumpy()
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **saved)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
