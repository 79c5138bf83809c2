"""Native graphs: an ``'mxnet'``-mode operator standing in a graph as MXNet's own operators.

The wing's job is to say, for one operator, parameter set, input signature and purpose
(``'train'``: hybridized and bound graphs; ``'export'``: a deployed one), whether the
op's ``Custom`` node can be replaced by MXNet operators, and to do the replacing.

Entry points:

* :func:`customop.graphs.graph_verdicts.native_graph`: the verdict for one op (trace the forward,
  transpose its gradient closures, or refuse by a rule of :mod:`customop.graphs.rules`),
  every graph checked by the one step of :mod:`customop.graphs.verify`;
* :func:`customop.graphs.splice.inline`: a Symbol with every op that can inline inlined;
* :mod:`customop.graphs.binding`: executors and CachedOps built on that Symbol (the
  ``inline`` runtime patch hands them here);
* :func:`customop.graphs.imperative.call`: an imperative call under ``record()`` that runs
  the op's native graph (dispatch's ``graph`` path);
* :func:`customop.explain` (:mod:`customop.graphs.explain`): the verdicts, for users.

The wing imports the eager core below it (``kernel``, ``gradients``, ``value_checks``,
``errors``) and reads operators through :mod:`customop.opinfo`; nothing below imports it.
"""
