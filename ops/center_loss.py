"""Center loss (Wen et al., ECCV 2016) whose class centers are an auxiliary state of the op."""

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks

__all__ = ["center_loss", "CenterLoss"]


def _check_params(num_class, alpha, scale):
    _checks.integer("center_loss", "num_class", num_class, 1)
    _checks.number("center_loss", "alpha", alpha, 0, 1)
    _checks.number("center_loss", "scale", scale)


def _check(data, label, centers, num_class, alpha, scale):
    _check_params(num_class, alpha, scale)
    if len(data.shape) != 2:
        raise _checks.fail(
            "center_loss", "data", f"must have shape (N, feature_dim), got {tuple(data.shape)}"
        )
    _checks.floating("center_loss", "data", data.dtype)
    _checks.same_shape("center_loss", "label", label.shape, data.shape[:1], "one class per sample")
    _checks.floating("center_loss", "centers", centers.dtype)


def _label_message(num_class):
    return f"has values that are not class indices in [0, num_class - 1] = [0, {num_class - 1}]"


def _centers_shape(data, label, num_class, alpha=0.5, scale=1.0):
    # MXNet asks for this before any forward runs (Symbols, Module): check the parameters here
    _check_params(num_class, alpha, scale)
    return (num_class, data[1])


@customop(
    "mxnet",
    name="ops.center_loss",
    aux={"centers": _centers_shape},
    infer_shape=lambda data, *_, **__: (data[0],),
    no_grad=("label",),
)
def center_loss(data, label, centers, *, num_class, alpha=0.5, scale=1.0):
    r"""Center loss: pull each feature towards the running center of its class.

    .. math::

        L_i = \frac{\lambda}{2} \lVert x_i - c_{y_i} \rVert_2^2, \qquad
        \frac{\partial L}{\partial x_i} = \lambda (x_i - c_{y_i}), \qquad
        c_j \leftarrow c_j - \alpha \frac{\sum_{i: y_i = j} (c_j - x_i)}{1 + n_j}

    with :math:`\lambda` = ``scale`` and :math:`n_j` the number of samples of class
    :math:`j` in the batch.  The centers are an **auxiliary state** ``(num_class,
    feature_dim)``: updated in place by the backward pass that computes ``data``'s gradient
    (training only; that gradient uses the centers before the update; a ``data`` without
    gradient leaves them unchanged), never differentiated.  In a symbol graph
    leave them out: MXNet creates ``<name>_centers`` (zeros), saved with the model's aux
    params; with NDArrays pass them; :class:`CenterLoss` owns them in Gluon.

    On several devices (or ``dist_sync`` workers) each copy moves with its own shard and
    the copies are merged after every step by the rule ``'sum'``: exact for a class seen on
    one device only, too far for a class seen on several (each shard divides by its own
    :math:`1 + n_j`).  No merge rule reproduces one device on the whole batch; the
    aux-states how-to gives the measured table (``benchmarks/aux_rules.py``).

    Parameters
    ----------
    data : float array, shape ``(N, feature_dim)``
        The features (an integer ``data`` raises ``TypeError``).
    label : float or int array, shape ``(N,)``
        Class indices in ``[0, num_class)`` (checked: one flag read back in ``'mxnet'``
        mode; ``customop.require``).
    centers : array, shape ``(num_class, feature_dim)``
        The auxiliary state (omit it with symbols).
    num_class : int
        Keyword.
    alpha : float in [0, 1], default 0.5
        The center update rate.
    scale : finite float, default 1
        The loss weight :math:`\lambda`.

    Notes
    -----
    Returns the per-sample loss ``(N,)``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> x, y = mx.nd.array([[1.0, 0.0], [3.0, 0.0]]), mx.nd.array([1, 1])
        >>> centers = mx.nd.zeros((2, 2)); x.attach_grad()
        >>> with mx.autograd.record():
        ...     loss = ops.center_loss(x, y, centers, num_class=2)
        >>> loss.backward()
        >>> loss.asnumpy(), centers.asnumpy()[1]   # c_1 += 0.5 * (1 + 3) / (1 + 2)
        (array([0.5, 4.5], dtype=float32), array([0.6666667, 0.       ], dtype=float32))
    """
    _check(data, label, centers, num_class, alpha, scale)
    _checks.class_indices(label, num_class, _label_message(num_class))
    diff = data - mx.nd.take(centers, label, axis=0)
    return 0.5 * scale * (diff * diff).sum(axis=1)


@center_loss.twin("numpy")
def _center_loss_numpy(data, label, centers, *, num_class, alpha=0.5, scale=1.0):
    _check(data, label, centers, num_class, alpha, scale)
    _checks.class_indices_numpy("center_loss", label, num_class, _label_message(num_class))
    diff = data - centers[label.astype(np.int64)]
    return 0.5 * scale * (diff * diff).sum(axis=1)


def _grad_data_nd(ans, data, label, centers, *, num_class, alpha=0.5, scale=1.0):
    def grad(g):
        diff = data - mx.nd.take(centers, label, axis=0)
        dx = scale * diff * g.reshape((-1, 1))
        onehot = mx.nd.one_hot(label, num_class, dtype=data.dtype)  # (N, num_class)
        sums = mx.nd.dot(onehot, diff, transpose_a=True)  # sum_{i: y_i = j} (x_i - c_j)
        centers[:] = centers + alpha * sums / (1 + onehot.sum(axis=0)).reshape((-1, 1))
        return dx

    return grad


def _grad_data_np(ans, data, label, centers, *, num_class, alpha=0.5, scale=1.0):
    def grad(g):
        y = label.astype(np.int64)
        diff = data - centers[y]
        dx = scale * diff * g.reshape((-1, 1))
        sums = np.zeros_like(centers)
        np.add.at(sums, y, diff)  # every sample of a class counts, repeats included
        centers[...] += alpha * sums / (1 + np.bincount(y, minlength=num_class))[:, None]
        return dx

    return grad


center_loss.def_grad(_grad_data_nd)
center_loss.numpy.def_grad(_grad_data_np)


class CenterLoss(mx.gluon.loss.Loss):
    r"""Gluon loss owning the class centers: ``center_loss(pred, label, centers)``.

    .. math:: L_n = \frac{\lambda}{2} \lVert \mathrm{pred}_n - c_{\mathrm{label}_n} \rVert^2

    Parameters
    ----------
    num_class : int
        The number of classes.
    feature_dim : int
        The length of a feature vector.
    alpha, scale
        As :func:`ops.center_loss`.
    weight, batch_axis
        As :class:`mxnet.gluon.loss.Loss`: the loss's scale, the mini-batch axis.

    Notes
    -----
    The centers are the Parameter ``centers`` (``grad_req='null'``, zeros), updated by
    every backward pass; they are saved with the block's parameters.  Inputs: ``pred``
    ``(N, feature_dim)``, ``label`` ``(N,)``.  Output: loss of shape ``(N,)``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> loss = ops.CenterLoss(num_class=3, feature_dim=2)
        >>> loss.initialize()
        >>> loss(mx.nd.ones((4, 2)), mx.nd.array([0, 1, 1, 2])).asnumpy()
        array([1., 1., 1., 1.], dtype=float32)
    """

    def __init__(
        self, num_class, feature_dim, alpha=0.5, scale=1.0, weight=None, batch_axis=0, **kwargs
    ):
        super().__init__(weight, batch_axis, **kwargs)
        _check_params(num_class, alpha, scale)
        _checks.integer("center_loss", "feature_dim", feature_dim, 1)
        self._op_params = dict(num_class=int(num_class), alpha=float(alpha), scale=float(scale))
        with self.name_scope():
            self.centers = self.params.get(
                "centers", shape=(num_class, feature_dim), init=mx.init.Zero(), grad_req="null"
            )

    def hybrid_forward(self, F, pred, label, centers):
        """The loss of each sample, ``(N,)``; Gluon passes the block's ``centers``."""
        loss = center_loss(pred, label, centers, **self._op_params)
        return loss if self._weight is None else loss * self._weight
