
# ---- issue 10: loss operators ('mxnet' mode; op.numpy is the 'numpy' twin) and Gluon blocks ----
from .center_loss import CenterLoss, center_loss  # noqa: F401
from .focal_loss import FocalLoss, focal_loss  # noqa: F401
from .smooth_l1 import SmoothL1Loss, smooth_l1  # noqa: F401
from .softmax_ce import SoftmaxCE, softmax_ce  # noqa: F401
from .tile import tile  # noqa: F401
from .wing_loss import WingLoss, wing_loss  # noqa: F401
# ---- end issue 10 ----
