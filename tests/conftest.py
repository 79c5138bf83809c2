import atexit
import os
import shutil
import tempfile

import mxnet as mx
import numpy as np
import pytest

# The processes the tests start keep their compiled modules (__pycache__): where
# PYTHONDONTWRITEBYTECODE is set (these machines set it), every fresh process compiled
# customop's and the tests' modules again, about 0.2 s of CPU each, in some 150 processes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Verdicts saved on disk (customop/graphs/verdict_files.py) go to a folder of this run's own,
# shared by the processes it starts and removed at its end: never the user's cache.
os.environ["CUSTOMOP_VERDICT_CACHE"] = tempfile.mkdtemp(prefix="customop-verdicts-")
atexit.register(shutil.rmtree, os.environ["CUSTOMOP_VERDICT_CACHE"], True)

# The test modules that take longest (worker-seconds in one `make test` run on 2 cores,
# 2026-11-28, after tests/fresh.py: most start processes), run first: under pytest-xdist's
# --dist loadfile a module is one unit of work, and the longest units first keep both
# workers busy to the end (docs/development.md, "The suite's time").
SLOWEST_FIRST = [
    "tests/customop/test_pairs.py",  # 58 s
    "tests/test_project.py",  # 58 s
    "tests/test_notebooks.py",  # 53 s
    "tests/test_packaging.py",  # 47 s
    "tests/test_dist_train.py",  # 44 s
    "tests/customop/test_launch.py",  # 32 s
    "tests/customop/test_subprocess.py",  # 30 s
    "tests/customop/test_residuals.py",  # 21 s
    "tests/customop/test_aux_rules.py",  # 19 s
    "tests/test_fresh.py",  # 18 s
    "tests/customop/test_export.py",  # 12 s
    "tests/test_ci.py",  # 9 s
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


@pytest.fixture
def tidy_rules_ran(monkeypatch):
    """A function: from its call on, customop.graphs.tidy's rules append their names, as
    they run, to the list it returns."""

    def counting() -> list:
        from customop.graphs import tidy

        ran: list = []
        monkeypatch.setattr(
            tidy,
            "RULES",
            tuple(
                r._replace(rewrite=lambda *a, _r=r: ran.append(_r.name) or _r.rewrite(*a))
                for r in tidy.RULES
            ),
        )
        return ran

    return counting


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    mx.random.seed(0)
    yield
    mx.nd.waitall()
