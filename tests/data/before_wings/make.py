"""Writes the files in this folder with the customop of commit d2cc5fc (before the wings moved
modules into customop/graphs/ and customop/deploy/); tests/customop/test_saved_before.py loads them.

Run from the repository root: PYTHONPATH=. python tests/data/before_wings/make.py (kept for
the record: the point of the files is that an older customop wrote them, so do not regenerate
them).
"""

import pickle
import sys
import warnings
from pathlib import Path

import mxnet as mx

import customop
from customop import ops
from tests.customop import auxops, opdefs

HERE = Path(__file__).resolve().parent


class Head(mx.gluon.HybridBlock):
    """An inlined library op, an inlined user op with def_grad and a 'numpy'-mode Custom node."""

    def hybrid_forward(self, F, pred, target):
        loss = ops.smooth_l1(pred, target, F.ones_like(F.slice_axis(pred, 1, 0, 1)))
        return opdefs.square_nd(loss) + opdefs.square_np(pred)


def main():
    ops_saved = [
        ops.topk,
        ops.focal_loss,
        auxops.counted,
        auxops.counted_nd,
        opdefs.square_np,
        opdefs.square_nd,
    ]
    with open(HERE / "ops.pkl", "wb") as f:
        pickle.dump(
            {
                "protocol2": pickle.dumps(ops_saved, 2),
                "highest": pickle.dumps(ops_saved, pickle.HIGHEST_PROTOCOL),
                "types": [o.op_type for o in ops_saved],
            },
            f,
            2,
        )
    x, t = mx.sym.var("x"), mx.sym.var("t")
    sym = mx.sym.Group(
        [opdefs.square_np(x) + ops.smooth_l1(x, t, mx.sym.ones((1,))), auxops.counted(x)]
    )
    with open(HERE / "symbol.pkl", "wb") as f:
        pickle.dump(sym, f, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        done = customop.export(
            Head(),
            str(HERE / "head"),
            mx.nd.ones((2, 4)),
            mx.nd.ones((2, 4)),
            not_inlined="warn",
            input_names=["pred", "target"],
        )
    print(done.symbol_file, done.params_file, done.kept, file=sys.stderr)
    mod = mx.mod.Module(sym, data_names=["x", "t"], label_names=None)
    mod.bind(data_shapes=[("x", (2, 3)), ("t", (2, 3))])
    mod.init_params()
    mod.save_checkpoint(str(HERE / "module"), 3)


if __name__ == "__main__":
    main()
