"""ops: research operators built only with the public ``customop`` API.

``ops.<name>`` is the ``'mxnet'``-mode operator (MXNet NDArray ops only: on a GPU
context it runs MXNet's CUDA kernels, no host copy); ``ops.<name>.numpy`` is its
readable ``'numpy'``-mode twin with the same docstring.  Losses come with Gluon
blocks (``ops.FocalLoss``, ``ops.SmoothL1Loss``, ...).

Op types are stable, ``'ops.<name>'`` and ``'ops.<name>.numpy'`` (and ``~without_<input>``
variants for optional inputs left out): saved graphs store them, and loading one imports
``customop.ops`` (``tests/ops/test_names.py`` pins the list).

Installed from a wheel this package is ``customop.ops`` (``from customop import ops``): a
top-level ``ops`` belongs to Canonical's Juju package.  In a checkout the same folder is
also ``ops`` (the repository root on ``sys.path``); both names then give one module object,
so every operator is defined and registered once.
"""

from . import _checkout  # noqa: F401  (first: in a checkout, makes customop.ops be ops)
from .arr_pick import arr_pick
from .box_decode import box_decode
from .box_encode import box_encode
from .box_iou import box_iou
from .box_nms import box_nms
from .center_loss import CenterLoss, center_loss
from .focal_loss import FocalLoss, focal_loss
from .ohem_sampler import ohem_sampler
from .smooth_l1 import SmoothL1Loss, smooth_l1
from .softmax_ce import SoftmaxCE, softmax_ce
from .tile import tile
from .topk import topk
from .wing_loss import WingLoss, wing_loss

__all__ = [
    # losses
    "focal_loss",
    "FocalLoss",
    "smooth_l1",
    "SmoothL1Loss",
    "wing_loss",
    "WingLoss",
    "center_loss",
    "CenterLoss",
    "softmax_ce",
    "SoftmaxCE",
    "tile",
    # detection
    "topk",
    "arr_pick",
    "box_iou",
    "box_nms",
    "box_encode",
    "box_decode",
    "ohem_sampler",
]
