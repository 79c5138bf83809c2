"""Run by `nox -s install`: an installed customop, used the way the README says, from outside
the checkout: the quick start, then a few operators from ``customop.ops``.

usage: python install_check.py README.md   (run from a directory outside the repository)
"""
import re
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

import customop

readme = Path(sys.argv[1]).read_text(encoding="utf-8")
checkout = Path(sys.argv[1]).resolve().parent
quick = re.search(r"## Quick start\s+```python\n(.*?)```", readme, re.S).group(1)
exec(compile(quick, "README quick start", "exec"), {"__name__": "__main__"})
print("README quick start ran", flush=True)

from customop import ops  # noqa: E402  (after the quick start, which needs only customop)

for module in (customop, ops):  # the installed copy, not the checkout's folders
    path = Path(module.__file__).resolve()
    assert "site-packages" in path.parts and checkout / "customop" not in path.parents, path

x = mx.nd.array([[0.5, -2.0, 3.0]])
x.attach_grad()
with mx.autograd.record():
    loss = ops.wing_loss(x, mx.nd.zeros((1, 3)), w=10.0, epsilon=2.0).sum()
loss.backward()
want = 10.0 / (2.0 + np.abs([0.5, -2.0, 3.0])) * np.sign([0.5, -2.0, 3.0])
np.testing.assert_allclose(x.grad.asnumpy()[0], want, rtol=1e-5)

logits = mx.nd.array([[2.0, -1.0], [0.0, 3.0]])
labels = mx.nd.array([1, 0])  # class 1, background
print("focal_loss", ops.focal_loss(logits, labels).asnumpy().round(4).tolist())
boxes = mx.nd.array([[0, 0, 10, 10], [5, 5, 15, 15]])
iou = ops.box_iou(boxes, boxes).asnumpy()
np.testing.assert_allclose(iou, [[1, 25 / 175], [25 / 175, 1]], rtol=1e-5)
values = ops.topk(mx.nd.array([[3.0, 1.0, 2.0]]), k=2, ret_typ="value").asnumpy()
np.testing.assert_allclose(values, [[3.0, 2.0]])
print("install check passed on Python", sys.version.split()[0], "from", customop.__file__)
