import mxnet as mx
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    mx.random.seed(0)
    yield
    mx.nd.waitall()
