"""Shape functions and gradient makers are checked against the op's parameters when the op
is decorated or ``def_grad`` is called, not at the first call that sets a parameter."""

import mxnet as mx
import numpy as np
import pytest

from customop import customop


def _ws(data, label, num_class, alpha=0.5):  # forgot 'scale'
    return (num_class, data[1])


def test_an_aux_shape_function_without_a_parameter_fails_at_decoration():
    with pytest.raises(TypeError) as info:

        @customop("mxnet", name="tests.helpers.ws_missing", aux={"w": _ws})
        def f(data, label, w, *, num_class, alpha=0.5, scale=1.0):
            return data

    msg = str(info.value)
    assert "'tests.helpers.ws_missing'" in msg and "aux state 'w'" in msg
    assert "_ws()" in msg and "parameter 'scale'" in msg and "**params" in msg


@pytest.mark.parametrize("where", ["infer_shape", "infer_type", "infer_input_shape"])
def test_a_lambda_without_a_parameter_fails_at_decoration(where):
    fn = lambda x, w: x  # noqa: E731 - the lambda of the reported port
    spec = {where: {"w": fn} if where == "infer_input_shape" else fn}
    with pytest.raises(TypeError) as info:

        @customop("numpy", name=f"tests.helpers.{where}_missing", **spec)
        def g(x, w, *, k=1):
            return x * w * k

    msg = str(info.value)
    assert f"'tests.helpers.{where}_missing'" in msg and "<lambda>()" in msg
    assert "parameter 'k'" in msg and where in msg


def test_a_required_parameter_the_op_gives_a_default_fails_at_decoration():
    # a call without k passes no k: the function must default it
    with pytest.raises(
        TypeError,
        match=r"infer_shape <lambda>\(\).*missing a required "
        r"argument: 'k'",
    ):

        @customop("numpy", name="tests.helpers.no_default", infer_shape=lambda x, *, k: x)
        def g(x, *, k=1):
            return x * k


def test_a_gradient_maker_without_a_parameter_fails_at_def_grad():
    @customop("numpy", name="tests.helpers.grad_missing")
    def h(x, *, k=1.0):
        return k * x

    with pytest.raises(TypeError) as info:
        h.def_grad(lambda ans, x: lambda g: g)
    msg = str(info.value)
    assert "'tests.helpers.grad_missing'" in msg and "gradient maker <lambda>()" in msg
    assert "parameter 'k'" in msg
    assert not h.grads  # nothing registered


def test_signatures_that_work_are_accepted_and_run_with_every_parameter():
    def weight_shape(data, weight, *, num_hidden, scale=1.0):
        return (num_hidden, data[1])

    @customop(
        "numpy",
        name="tests.helpers.works",
        infer_input_shape={"weight": weight_shape},
        infer_shape=lambda data, weight, **params: (data[0], params["num_hidden"]),
        aux={"calls": lambda data, weight, **_: (1,)},
    )
    def linear(data, weight, calls, *, num_hidden, scale=1.0):
        calls[...] += 1
        return scale * data @ weight.T

    # a residual the closure names (keyword-only, no default) is not a parameter: accepted
    def grad(ans, data, weight, calls, *, num_hidden, scale=1.0):
        return lambda g: scale * g @ weight

    linear.def_grad(grad)
    linear.def_grad(
        lambda ans, data, weight, calls, *, probs=None, **params: lambda g: g.T @ data, argnum=1
    )
    sym = linear(mx.sym.var("data"), mx.sym.var("w"), num_hidden=3, scale=2.0, name="fc")
    arg, out, aux = sym.infer_shape(data=(4, 5))
    assert arg == [(4, 5), (3, 5)] and out == [(4, 3)] and aux == [(1,)]
    x, w, calls = mx.nd.ones((4, 5)), mx.nd.ones((3, 5)), mx.nd.zeros((1,))
    x.attach_grad()
    with mx.autograd.record():
        y = linear(x, w, calls, num_hidden=3, scale=2.0)
    y.backward()
    np.testing.assert_allclose(y.asnumpy(), np.full((4, 3), 10.0))
    np.testing.assert_allclose(x.grad.asnumpy(), np.full((4, 5), 6.0))


def test_every_library_op_decorates_with_checked_helpers():
    from customop import ops

    assert ops.center_loss.aux_shape_fns and ops.center_loss.grads
