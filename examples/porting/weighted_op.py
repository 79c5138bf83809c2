r"""A layer with a weight input whose shape is inferred and one backward for data and weight,
hand-written and ported: a cosine-margin classifier (CosFace / AM-softmax, Wang et al. 2018)
whose margin grows with training (a schedule as in large-margin softmax, Liu et al. 2016).

.. math::

    \cos\theta_{ij} = \hat x_i \cdot \hat w_j, \qquad
    \mathrm{out}_{ij} = s \left(\cos\theta_{ij} - [\text{training}]\,
        \frac{m}{1 + \beta}\,[j = y_i]\right), \qquad
    \beta = \max\!\left(\beta_{\min},\ \beta_0 (1 + \gamma t)^{-p}\right)

with :math:`\hat x = x / \lVert x \rVert`, :math:`\hat w = w / \lVert w \rVert` (rows),
``weight`` of shape ``(num_hidden, feature_dim)`` (inferred from ``data``, as
``FullyConnected`` infers its weight) and :math:`t` the number of backward passes so far,
an aux state ``iteration`` (merged by ``'first'``: every device counts the same steps).
The gradients of ``data`` and ``weight`` share :math:`\hat x`, :math:`\hat w` and the
scaled head gradient, and the schedule advances once per backward:

.. math::

    \frac{\partial L}{\partial x_i} = \frac{g_i - \hat x_i (g_i \cdot \hat x_i)}
        {\lVert x_i \rVert},\ g = s\,G\,\hat W; \qquad
    \frac{\partial L}{\partial w_j} = \frac{h_j - \hat w_j (h_j \cdot \hat w_j)}
        {\lVert w_j \rVert},\ h = s\,G^\top \hat X.
"""

import mxnet as mx

from customop import customop, residuals


def _unit_rows(a):
    norm = mx.nd.sqrt((a * a).sum(axis=1, keepdims=True))
    return a / norm, norm


def _margin(iteration, margin, base, gamma, power, beta_min):
    """The margin after ``iteration`` backward passes, as a (1, 1) array (no host read)."""
    beta = mx.nd.maximum(base * (1 + gamma * iteration) ** -power, beta_min)
    return (margin / (1 + beta)).reshape((1, 1))


# original-begin
class MarginCosine(mx.operator.CustomOp):
    def __init__(self, num_hidden, margin, scale, base, gamma, power, beta_min):
        super().__init__()
        self.num_hidden, self.margin, self.scale = num_hidden, margin, scale
        self.schedule = (base, gamma, power, beta_min)

    def forward(self, is_train, req, in_data, out_data, aux):
        data, label, weight = in_data
        xh, xnorm = _unit_rows(data)
        wh, wnorm = _unit_rows(weight)
        cos = mx.nd.dot(xh, wh, transpose_b=True)
        if is_train:
            m = _margin(aux[0], self.margin, *self.schedule)
            cos = cos - m * mx.nd.one_hot(label, self.num_hidden)
        self.saved = (xh, xnorm, wh, wnorm)  # for backward: the same object runs both
        self.assign(out_data[0], req[0], self.scale * cos)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        xh, xnorm, wh, wnorm = self.saved
        g = self.scale * out_grad[0]
        dxh, dwh = mx.nd.dot(g, wh), mx.nd.dot(g, xh, transpose_a=True)
        self.assign(in_grad[0], req[0], (dxh - xh * (dxh * xh).sum(axis=1, keepdims=True)) / xnorm)
        self.assign(in_grad[1], req[1], mx.nd.zeros_like(in_data[1]))
        self.assign(in_grad[2], req[2], (dwh - wh * (dwh * wh).sum(axis=1, keepdims=True)) / wnorm)
        aux[0][:] = aux[0] + 1
        aux[0].wait_to_read()  # MXNet does not order this write with later reads otherwise


@mx.operator.register("porting_margin_cosine")
class MarginCosineProp(mx.operator.CustomOpProp):
    def __init__(
        self, num_hidden, margin=0.35, scale=16.0, base=100.0, gamma=0.5, power=1.0, beta_min=0.0
    ):
        super().__init__(need_top_grad=True)
        self.num_hidden = int(num_hidden)
        self.args = [float(v) for v in (margin, scale, base, gamma, power, beta_min)]

    def list_arguments(self):
        return ["data", "label", "weight"]

    def list_outputs(self):
        return ["output"]

    def list_auxiliary_states(self):
        return ["iteration"]

    def infer_shape(self, in_shape):
        data = in_shape[0]
        if not data:
            return in_shape, [()], [(1,)]
        weight = (self.num_hidden, data[1])  # like FullyConnected's
        return [data, (data[0],), weight], [(data[0], self.num_hidden)], [(1,)]

    def infer_type(self, in_type):
        return [in_type[0]] * 3, [in_type[0]], [in_type[0]]

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0], *in_data]

    def create_operator(self, ctx, shapes, dtypes):
        margin, scale, *schedule = self.args
        return MarginCosine(self.num_hidden, margin, scale, *schedule)


# original-end


# port-begin
def _weight_shape(data, label, weight, *, num_hidden, **_):
    return (num_hidden, data[1])  # like FullyConnected's


@customop(
    "mxnet",
    infer_input_shape={"weight": _weight_shape},
    no_grad=("label",),
    aux={"iteration": (lambda *shapes, **_: (1,), "first")},
)
def margin_cosine(
    data,
    label,
    weight,
    iteration,
    *,
    num_hidden,
    margin=0.35,
    scale=16.0,
    base=100.0,
    gamma=0.5,
    power=1.0,
    beta_min=0.0,
):
    """Scaled cosine logits with a growing margin on each row's label (training only)."""
    xh, xnorm = _unit_rows(data)
    wh, wnorm = _unit_rows(weight)
    cos = mx.nd.dot(xh, wh, transpose_b=True)
    if mx.autograd.is_training():
        m = _margin(iteration, margin, base, gamma, power, beta_min)
        cos = cos - m * mx.nd.one_hot(label, num_hidden)
    return residuals(scale * cos, xh=xh, xnorm=xnorm, wh=wh, wnorm=wnorm)


def _margin_cosine_grad(
    ans, data, label, weight, iteration, *, xh, xnorm, wh, wnorm, scale=16.0, **_
):
    def grad(g):  # once per backward: both gradients, and the schedule's step
        g = scale * g
        dxh, dwh = mx.nd.dot(g, wh), mx.nd.dot(g, xh, transpose_a=True)
        iteration[:] = iteration + 1
        return (
            (dxh - xh * (dxh * xh).sum(axis=1, keepdims=True)) / xnorm,
            (dwh - wh * (dwh * wh).sum(axis=1, keepdims=True)) / wnorm,
        )

    return grad


margin_cosine.def_grad(_margin_cosine_grad, argnum=(0, 2))
# port-end
