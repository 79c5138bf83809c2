"""The ``python`` blocks of docs/howto/torch_and_jax.md run, in order, in one namespace.

The documentation build has no torch or jax, so the page's examples are plain fences; this
test is what runs them (where the ``port`` extra is installed)."""

import os
import re

import pytest

pytest.importorskip("torch", reason="the port tests need torch (pip install 'customop[port]')")
pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "howto", "torch_and_jax.md")


def test_page_blocks_run(tmp_path, monkeypatch):
    with open(PAGE) as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    namespace = {}
    for k, block in enumerate(blocks):
        block = block.replace("/tmp/focal.port.json", str(tmp_path / "focal.port.json"))
        exec(compile(block, f"{PAGE} block {k}", "exec"), namespace)  # noqa: S102
