import os

import mxnet as mx
import numpy as np
import pytest

# The processes the tests start keep their compiled modules (__pycache__): where
# PYTHONDONTWRITEBYTECODE is set (these machines set it), every fresh process compiled
# customop's and the tests' modules again, about 0.2 s of CPU each, in some 150 processes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The test modules that take longest (worker-seconds in one `make test` run on 2 cores,
# 2026-11-27: most start fresh processes, each paying MXNet's import), run first: under
# pytest-xdist's --dist loadfile a module is one unit of work, and the longest units first
# keep both workers busy to the end (docs/development.md, "The suite's time").
SLOWEST_FIRST = [
    "tests/customop/test_pairs.py",  # 102 s
    "tests/test_dist_train.py",  # 88 s
    "tests/test_project.py",  # 65 s
    "tests/test_notebooks.py",  # 57 s
    "tests/customop/test_launch.py",  # 44 s
    "tests/customop/test_runtime.py",  # 38 s
    "tests/test_packaging.py",  # 28 s
    "tests/customop/test_reliability.py",  # 26 s
    "tests/customop/test_pickle.py",  # 26 s
    "tests/customop/test_aux_rules.py",  # 23 s
    "tests/customop/test_residuals.py",  # 18 s
    "tests/customop/test_value_checks.py",  # 15 s
    "tests/customop/test_composition.py",  # 15 s
    "tests/customop/test_check.py",  # 12 s
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(),
                                         len(rank)))


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    mx.random.seed(0)
    yield
    mx.nd.waitall()
