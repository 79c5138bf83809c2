"""Deployment: models of MXNet's own operators that plain MXNet, its C predict API and ONNX
Runtime load, and loading saved graphs that still hold our ``Custom`` nodes.

Entry points:

* :func:`customop.export` / :func:`customop.to_onnx` (:mod:`customop.deploy.export`):
  the block's graph with every op inlined for ``'export'`` (:mod:`customop.graphs`),
  then made what a deployer expects (:mod:`customop.deploy.rewrites`, other batch sizes
  through :mod:`customop.deploy.batch_sizes`); ONNX translations MXNet's converter
  lacks are :mod:`customop.deploy.onnx_rules`;
* :func:`customop.imports` / :func:`customop.load_checkpoint`
  (:mod:`customop.deploy.trusted_imports`): saved graphs, every ``Custom`` node's op registered
  first from code the caller chose (a model file never chooses what is imported).

The wing sits above :mod:`customop.graphs` and the core; nothing below imports it (the
``onnxops`` runtime patch imports the ONNX rules when :func:`customop.to_onnx` installs it).
"""
