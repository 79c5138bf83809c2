"""Three hand-written MXNet ``CustomOp``\\ s, each next to its ``@customop`` port.

Each module holds the classic ``mx.operator.CustomOp`` + ``CustomOpProp`` pair (as in
MXNet's "create new operators" tutorial) and the port; ``tests/test_porting.py`` runs both
on the same inputs on the ``nd``, ``sym`` and hybridized paths, and ``docs/porting.md``
walks through them:

* :mod:`.loss_layer`: an output layer (``need_top_grad=False``), a weighted sigmoid loss;
* :mod:`.sampler`: a proposal-target sampler with four named outputs and no gradient;
* :mod:`.weighted_op`: a cosine-margin layer whose weight's shape is inferred, with one
  backward for data and weight, and a margin schedule kept as an aux state.
"""
