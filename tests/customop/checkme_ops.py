"""Small operators for the ``python -m customop.check`` command-line tests."""

import numpy

from customop import customop


@customop("numpy")
def leaky(x, alpha=0.1, kind="leaky"):
    assert kind == "leaky", kind  # a --param value that is not a literal arrives as a string
    return numpy.where(x > 0, x, alpha * x)


leaky.def_grad(lambda ans, x, alpha=0.1, kind="leaky": lambda g: g * numpy.where(x > 0, 1, alpha))


@customop("numpy")
def pick_nll(x, y, scale=1.0):
    """Per-row ``-scale * log softmax(x)[y]``; ``y`` is an integer label."""
    logp = x - numpy.log(numpy.sum(numpy.exp(x), axis=1, keepdims=True))
    return -scale * logp[numpy.arange(x.shape[0]), y]


def _pick_nll_grad(ans, x, y, scale=1.0):
    def grad(g):
        p = numpy.exp(x) / numpy.sum(numpy.exp(x), axis=1, keepdims=True)
        p[numpy.arange(x.shape[0]), y] -= 1
        return scale * g[:, None] * p

    return grad


pick_nll.def_grad(_pick_nll_grad)


@customop("numpy")
def wrong_square(x):
    return x * x


wrong_square.def_grad(lambda ans, x: lambda g: 3 * x * g)  # seeded bug: d(x^2)/dx is 2x


@customop("numpy")
def sqrt_area(boxes):
    """``sqrt((x2 - x1) (y2 - y1))`` of (x1, y1, x2, y2) rows: NaN for an inverted box."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    with numpy.errstate(invalid="ignore"):
        return numpy.sqrt(w * h)


sqrt_area.def_grad(
    lambda ans, boxes: (
        lambda g: (
            (g / (2 * ans))[:, None]
            * numpy.stack(
                [
                    -(boxes[:, 3] - boxes[:, 1]),
                    -(boxes[:, 2] - boxes[:, 0]),
                    boxes[:, 3] - boxes[:, 1],
                    boxes[:, 2] - boxes[:, 0],
                ],
                axis=1,
            )
        )
    )
)
