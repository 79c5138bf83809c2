"""Merge rules of aux states (aux={'name': (shape_fn, 'sum'|'mean'|'first'|'local')}): every
rule on two contexts (Gluon plain and hybridized, Module, AuxSync) and on two dist_sync workers,
against float64 references written from the rules' definitions (auxops.merged_reference)."""

import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from customop import aux_merge, customop
from customop.distributed.auxsync import AuxStateWarning, AuxSync
from tests.customop import aux_rules_worker as worker
from tests.customop.auxops import RULE_STATES, MergedBlock, merged, merged_reference
from tests.customop.test_launch import _job_processes

ROOT = Path(__file__).resolve().parents[2]
TWO = [mx.cpu(0), mx.cpu(1)]


def _assert_states(copies_by_state, shards, first_copy=0):
    want = merged_reference(shards)
    for name in RULE_STATES:
        for d, copy in enumerate(copies_by_state[name]):
            np.testing.assert_array_equal(
                copy.asnumpy(),
                want[first_copy + d][name],
                err_msg=f"{name} on copy {first_copy + d}",
            )


def test_declaring_rules_and_repr():
    assert repr(merged).endswith(
        "aux=[total:sum, average:mean, leader:first, own:local, steps:first]>"
    )
    assert merged.aux_rules == {
        "total": "sum",
        "average": "mean",
        "leader": "first",
        "own": "local",
        "steps": "first",
    }
    assert aux_merge.rule_of(merged.op_type, "own") == "local"
    assert aux_merge.rule_of(merged.op_type, "total") == "sum"
    with pytest.raises(
        ValueError,
        match=r"customop 'tests.bad_rule': aux=\{'s': \(\.\.\., "
        r"'max'\)\}: the merge rule .* must be one of 'sum', 'mean', 'first', "
        r"'local'",
    ):
        customop("numpy", name="tests.bad_rule", aux={"s": (lambda x: (1,), "max")})(lambda x, s: x)
    with pytest.raises(TypeError, match=r"customop 'tests.bad_spec': aux=\{'s': \.\.\.\} must map"):
        customop("numpy", name="tests.bad_spec", aux={"s": ("sum", lambda x: (1,))})(lambda x, s: x)

    @customop("numpy", name="tests.twin_rules", aux={"s": (lambda x: (1,), "mean")})
    def with_state(x, s):
        return x

    @with_state.twin("mxnet")
    def _with_state_nd(x, s):
        return x

    assert with_state.mxnet.aux_rules == {"s": "mean"}
    assert aux_merge.rule_of("tests.twin_rules.mxnet", "s") == "mean"


@pytest.mark.parametrize(
    "api, hybridize",
    [("gluon", False), ("gluon", True), ("module", None)],
    ids=["gluon", "gluon-hybridized", "module"],
)
def test_every_rule_on_two_contexts(api, hybridize):
    shards = worker.shards(1)
    run = worker.gluon if api == "gluon" else worker.module
    copies = run("device", 0, shards, TWO, hybridize=hybridize)
    # 'local' on Gluon: each copy is its own although the Trainer's first step broadcast
    # device 0's copy over the others; 'steps' ('first') counts steps, not passes
    _assert_states(copies, shards)


def test_aux_sync_by_hand_follows_the_rules():
    shards = worker.shards(1)
    net = MergedBlock(worker.DIM, prefix="hand_")
    net.initialize(mx.init.Xavier(), ctx=TWO)
    sync = AuxSync([getattr(net, n) for n in RULE_STATES])  # no Trainer: a hand-written step
    for step in shards:
        xs = [mx.nd.array(x, ctx=c) for x, c in zip(step, TWO)]
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            losses = [net(x).sum() for x in xs]
        mx.autograd.backward(losses)
        sync()
    _assert_states({n: getattr(net, n).list_data() for n in RULE_STATES}, shards)


@customop("numpy", name="tests.only_local", aux={"mine": (lambda x: (1,), "local")})
def only_local(x, mine):
    return x + 0


@customop("numpy", name="tests.only_sum", aux={"mine": lambda x: (1,)})
def only_sum(x, mine):
    return x + 0


only_local.def_grad(lambda ans, x, mine: lambda g: g)
only_sum.def_grad(lambda ans, x, mine: lambda g: g)


@pytest.mark.parametrize("op, warned", [(only_sum, 1), (only_local, 0)], ids=["sum", "local"])
def test_local_states_are_never_warned_about(op, warned):
    # Copies updated with nothing keeping them equal warn (see test_aux_merge.py); 'local' ones
    # are meant to differ.
    aux_merge._warned.clear()
    mine = [mx.nd.zeros((1,), ctx=c) for c in TWO]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(aux_merge.UNSYNCED_PASSES + 2):
            for c, state in zip(TWO, mine):
                x = mx.nd.ones((2,), ctx=c)
                x.attach_grad()
                with mx.autograd.record():
                    y = op(x, state)
                y.backward()
    assert len([w for w in got if issubclass(w.category, AuxStateWarning)]) == warned


def _launch(out, api):
    mark = uuid.uuid4().hex
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "customop.distributed.launch",
            "-n",
            "2",
            "-s",
            "1",
            "--launcher",
            "local",
            "--timeout",
            "90",
            sys.executable,
            str(Path(worker.__file__)),
            "--kvstore",
            "dist_sync",
            "--api",
            api,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark},
    )
    time.sleep(0.2)
    assert _job_processes(mark) == [], "processes of the job outlived the launcher"
    return proc


@pytest.mark.parametrize("api", ["gluon", "module"])
def test_every_rule_on_two_dist_sync_workers(api, tmp_path):
    # 2 workers x 2 devices: 4 copies of each state; 'gluon' runs the Trainer, then a loop of
    # its own with AuxSync, on one kvstore
    proc = _launch(tmp_path, api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AuxStateWarning" not in proc.stderr
    shards = worker.shards(2)
    for rank in range(2):
        with np.load(tmp_path / f"rank{rank}.npz") as f:
            saved = dict(f)
        for run in ["gluon", "by_hand"] if api == "gluon" else ["module"]:
            copies = {
                n: [mx.nd.array(saved[f"{run}/{n}@{rank * 2 + d}"]) for d in range(2)]
                for n in RULE_STATES
            }
            _assert_states(copies, shards, first_copy=rank * 2)
