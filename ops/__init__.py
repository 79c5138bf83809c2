
# ---- issue 11: detection operators (topk do_sort, arr_pick, legacy boxes, OHEM) ----
from .arr_pick import arr_pick  # noqa: E402,F401
from .box_decode import box_decode  # noqa: E402,F401
from .box_encode import box_encode  # noqa: E402,F401
from .box_iou import box_iou  # noqa: E402,F401
from .box_nms import box_nms  # noqa: E402,F401
from .ohem_sampler import ohem_sampler  # noqa: E402,F401
from .topk import topk  # noqa: E402,F401
# ---- end issue 11 ----
