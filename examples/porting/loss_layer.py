r"""A loss (output) layer, hand-written and ported: weighted sigmoid cross-entropy.

.. math::

    p = \sigma(x), \qquad
    \frac{\partial L}{\partial x} = \frac{w_y (p - y)}{N}, \qquad
    w_y = \begin{cases} \text{pos\_weight} & y = 1 \\ 1 & y = 0 \end{cases}

The forward returns the probabilities ``p``; the backward ignores the head gradient
(``need_top_grad=False``): it is the gradient of the weighted cross-entropy, which the
layer never computes.  ``label`` gets no gradient.
"""

import mxnet as mx

from customop import customop


# original-begin
class WeightedSigmoid(mx.operator.CustomOp):
    def __init__(self, pos_weight):
        super().__init__()
        self.pos_weight = pos_weight

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], mx.nd.sigmoid(in_data[0]))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        p, y = out_data[0], in_data[1]  # out_grad is empty: need_top_grad=False
        weight = self.pos_weight * y + (1 - y)
        self.assign(in_grad[0], req[0], weight * (p - y) / p.shape[0])
        self.assign(in_grad[1], req[1], mx.nd.zeros_like(y))


@mx.operator.register("porting_weighted_sigmoid")
class WeightedSigmoidProp(mx.operator.CustomOpProp):
    def __init__(self, pos_weight=1.0):
        super().__init__(need_top_grad=False)
        self.pos_weight = float(pos_weight)  # every keyword arrives as a string

    def list_arguments(self):
        return ["data", "label"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return [in_shape[0], in_shape[0]], [in_shape[0]], []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [in_data[1], out_data[0]]  # label and p; neither data nor out_grad

    def create_operator(self, ctx, shapes, dtypes):
        return WeightedSigmoid(self.pos_weight)


# original-end


# port-begin
@customop("mxnet", need_top_grad=False, no_grad=("label",))
def weighted_sigmoid(data, label, *, pos_weight=1.0):
    """Sigmoid probabilities; the backward is weighted sigmoid cross-entropy's."""
    return mx.nd.sigmoid(data)


def _weighted_sigmoid_grad(ans, data, label, *, pos_weight=1.0):
    def grad(g):  # g is None: an output layer ignores the head gradient
        return (pos_weight * label + (1 - label)) * (ans - label) / ans.shape[0]

    return grad


weighted_sigmoid.def_grad(_weighted_sigmoid_grad)
# port-end
