
# ---- issue 11: detection operators (topk do_sort, arr_pick, legacy boxes, OHEM) ----
from .topk import topk  # noqa: E402,F401
