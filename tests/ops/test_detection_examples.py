"""The runnable examples in the issue-11 operators' docstrings run and print what they say."""

import doctest

import pytest

import ops

DOCUMENTED = [
    ops.topk,
    ops.arr_pick,
    ops.box_iou,
    ops.box_nms,
    ops.box_encode,
    ops.box_decode,
    ops.ohem_sampler,
]


@pytest.mark.parametrize("obj", DOCUMENTED, ids=lambda o: getattr(o, "__name__", repr(o)))
def test_docstring_example(obj):
    tests = doctest.DocTestFinder().find(obj, getattr(obj, "__name__", "op"), globs={})
    assert tests and any(t.examples for t in tests)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
