"""One dist_sync worker (or one process, --kvstore local) training ``auxops.merged`` through
Gluon's Trainer, a loop of its own with AuxSync, and Module; writes every copy of every aux state to
``<out>/rank<r>.npz`` as ``<api>/<state>@<copy>`` where ``copy`` is the global copy index
(worker rank * devices + device).

Run by tests/customop/test_aux_rules.py under ``python -m customop.distributed.launch``.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from customop.distributed.auxsync import AuxSync  # noqa: E402
from tests.customop.auxops import RULE_STATES, MergedBlock, merged  # noqa: E402

DIM, ROWS, STEPS, DEVICES = 3, 2, 3, 2


def shards(workers):
    """``[step][copy]`` rows: one shard per device of every worker (integers: exact sums)."""
    rng = np.random.RandomState(7)
    copies = workers * DEVICES
    return [
        [rng.randint(-4, 5, size=(ROWS, DIM)).astype(np.float32) for _ in range(copies)]
        for _ in range(STEPS)
    ]


def gluon(kv, rank, data, ctxs, hybridize=True):
    net = MergedBlock(DIM, prefix="net_")
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if hybridize:
        net.hybridize()
    trainer = mx.gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv, update_on_kvstore=False
    )
    for step in data:
        mine = step[rank * DEVICES : (rank + 1) * DEVICES]
        xs = [mx.nd.array(x, ctx=c) for x, c in zip(mine, ctxs)]
        for x in xs:
            x.attach_grad()  # merged's backward (which moves its states) runs for it
        with mx.autograd.record():
            losses = [net(x).sum() for x in xs]
        mx.autograd.backward(losses)
        trainer.step(ROWS * len(step))
    return {name: getattr(net, name).list_data() for name in RULE_STATES}


def by_hand(kv, rank, data, ctxs, hybridize=True):
    """No Trainer: a loop of one's own, with AuxSync merging the states after each step."""
    net = MergedBlock(DIM, prefix="hand_")
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if hybridize:
        net.hybridize()
    sync = AuxSync([getattr(net, name) for name in RULE_STATES], kv)
    for step in data:
        mine = step[rank * DEVICES : (rank + 1) * DEVICES]
        xs = [mx.nd.array(x, ctx=c) for x, c in zip(mine, ctxs)]
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            losses = [net(x).sum() for x in xs]
        mx.autograd.backward(losses)
        sync()
    return {name: getattr(net, name).list_data() for name in RULE_STATES}


def module(kv, rank, data, ctxs, hybridize=None):
    out = mx.sym.FullyConnected(merged(mx.sym.var("data"), name="m"), num_hidden=DIM, name="fc")
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(out)), data_names=["data"], label_names=None, context=ctxs
    )
    mod.bind(data_shapes=[("data", (ROWS * DEVICES, DIM))], inputs_need_grad=True)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kv, optimizer_params={"learning_rate": 0.01})
    for step in data:
        # Module cuts the batch into one slice per device, in order
        batch = np.concatenate(step[rank * DEVICES : (rank + 1) * DEVICES])
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(batch)]))
        mod.update()
    group = mod._exec_group
    return {name: group.aux_arrays[group.aux_names.index(f"m_{name}")] for name in RULE_STATES}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--out", required=True)
    parser.add_argument("--api", choices=("gluon", "module"), action="append")
    args = parser.parse_args(argv)
    if "dist" in args.kvstore:
        os.environ["MXNET_UPDATE_ON_KVSTORE"] = "0"  # Module: the servers only sum (see agree)
    ctxs = [mx.cpu(i) for i in range(DEVICES)]
    saved = {}
    # A kvstore per API: Gluon's and AuxSync's keys are ints, Module's names (one worker
    # process cannot create a second dist kvstore, so Module is a job of its own).
    kvstores = {}
    for api, run in (("gluon", gluon), ("by_hand", by_hand), ("module", module)):
        family = "module" if api == "module" else "gluon"
        if args.api and family not in args.api:
            continue
        if family not in kvstores:
            kvstores[family] = mx.kv.create(args.kvstore)
        kv = kvstores[family]
        rank, workers = kv.rank, kv.num_workers
        data = shards(workers)
        for name, copies in run(kv, rank, data, ctxs).items():
            for d, copy in enumerate(copies):
                saved[f"{api}/{name}@{rank * DEVICES + d}"] = copy.asnumpy()
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **saved)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
