"""Verdicts kept on disk between processes: a second process takes the first's verdict
without checking again, a changed op (same name, other code) is checked again, a corrupt
entry is a miss, the switch turns it off, concurrent writers leave whole files."""

import hashlib
import json
import multiprocessing
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from customop.graphs import code_hash, verdict_files
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]

MODULE = """
import mxnet as mx
from customop import customop

FACTOR = {factor}


def _scaled(x):
    return x * {inner}


@customop("mxnet")
def scale(x):
    return _scaled(x) * FACTOR + 1


@customop("mxnet")
def sized(x):  # refused for training: its graph holds at this batch size only
    return x * x.shape[0]
"""

CHILD = r"""
import json, sys
import mxnet as mx
import numpy as np
sys.path.insert(0, sys.argv[1])
import verdictops
from customop import explain, ops
from customop.graphs import graph_verdicts, verify
checked, traced = [], []
original, decide = verify._checked, graph_verdicts._decide
def counting(*a):
    checked.append(1)
    return original(*a)
def tracing(op, *a):
    traced.append(op.op_type)
    return decide(op, *a)
verify._checked = counting
graph_verdicts._decide = tracing
x = mx.sym.var("x")
exe = verdictops.scale(x).simple_bind(mx.cpu(), x=(2, 3))
value = np.arange(6, dtype="f").reshape(2, 3) - 2
exe.arg_dict["x"][:] = value
out = exe.forward(is_train=True)[0]
exe.backward(mx.nd.ones(out.shape))
refused = explain(verdictops.sized, (2, 3))
y = mx.sym.var("y")
loss = ops.smooth_l1(y, mx.sym.var("sigma"), weight=mx.sym.var("w"))
lib = loss.simple_bind(mx.cpu(), y=(2, 3), sigma=(1,), w=(2, 3))
lib.arg_dict["y"][:] = value
lib.arg_dict["sigma"][:] = 1.5
lib.arg_dict["w"][:] = 0.5
lib_out = lib.forward(is_train=True)[0]
lib.backward(mx.nd.ones(lib_out.shape))
print(json.dumps({
    "checked": len(checked),
    "traced": sorted(traced),
    "library": [lib.customop_inlined is not None, lib_out.asnumpy().tolist(),
                lib.grad_dict["y"].asnumpy().tolist()],
    "inlined": exe.customop_inlined is not None,
    "out": out.asnumpy().tolist(),
    "grad": exe.grad_dict["x"].asnumpy().tolist(),
    "refused": str(refused),
}))
"""


def _module(folder: Path, factor=2.0, inner=1.0) -> None:
    (folder / "verdictops.py").write_text(MODULE.format(factor=factor, inner=inner))
    cached = folder / "__pycache__"
    if cached.exists():  # the source changed within the same second: no stale bytecode
        for f in cached.iterdir():
            f.unlink()


def _child(folder: Path, cache: str) -> dict:
    env = dict(os.environ, CUSTOMOP_VERDICT_CACHE=cache)
    env.pop("CUSTOMOP_RUNTIME_OFF", None)
    return fresh.run_json([sys.executable, "-c", CHILD, str(folder)], cwd=str(ROOT), env=env)


def _want(factor, inner):  # float64, from the formula
    x = np.arange(6, dtype=np.float64).reshape(2, 3) - 2
    return x * inner * factor + 1, np.full(x.shape, inner * factor)


def _check(got, factor, inner):
    out, grad = _want(factor, inner)
    assert got["inlined"], got
    np.testing.assert_allclose(got["out"], out, rtol=1e-6)
    np.testing.assert_allclose(got["grad"], grad, rtol=1e-6)


def test_a_second_process_takes_the_saved_verdicts_and_a_changed_op_is_checked_again(tmp_path):
    cache = str(tmp_path / "cache")
    _module(tmp_path)
    first = _child(tmp_path, cache)
    # scale's training graph, sized's for training (refused) and export, smooth_l1's
    assert first["checked"] == 4, first
    _check(first, 2.0, 1.0)
    assert "input shapes" in first["refused"], first["refused"]
    assert first["traced"] == sorted(
        ["verdictops.scale", "verdictops.sized", "verdictops.sized", "ops.smooth_l1"]
    )
    inlined, out, grad = first["library"]
    x, s = np.arange(6.0).reshape(2, 3) - 2, 1.5  # smooth L1 from its formula, float64
    inside = np.abs(x) < 1 / s**2
    assert inlined
    np.testing.assert_allclose(
        out, 0.5 * np.where(inside, 0.5 * (s * x) ** 2, np.abs(x) - 0.5 / s**2), rtol=1e-6
    )
    np.testing.assert_allclose(grad, 0.5 * np.where(inside, s**2 * x, np.sign(x)), rtol=1e-6)
    saved = sorted(os.listdir(cache))
    assert saved and all(n.endswith(".json") for n in saved)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(os.path.join(cache, n)).st_mode) == 0o600 for n in saved)

    second = _child(tmp_path, cache)
    assert second["checked"] == 0, second  # every verdict, the refusal's too, from disk
    # the library's op is not even traced: its verdict is saved with its graph
    assert second["traced"] == ["verdictops.scale", "verdictops.sized", "verdictops.sized"]
    assert dict(second, checked=4, traced=first["traced"]) == first

    _module(tmp_path, factor=3.0)  # the same op's name, another constant its forward reads
    third = _child(tmp_path, cache)
    assert third["checked"] == 1, third  # scale checked again; sized did not change
    _check(third, 3.0, 1.0)
    _module(tmp_path, factor=3.0, inner=0.5)  # a helper the forward calls changed
    fourth = _child(tmp_path, cache)
    assert fourth["checked"] == 1, fourth
    _check(fourth, 3.0, 0.5)


def test_corrupt_entries_are_misses_and_the_switch_turns_the_files_off(tmp_path):
    cache = tmp_path / "cache"
    _module(tmp_path)
    first = _child(tmp_path, str(cache))
    broken = {"nodes": [{"op": "relu", "name": "r", "attrs": {}, "inputs": [["node", 5, 0]]}]}
    for i, entry in enumerate(sorted(cache.iterdir())):  # garbage, wrong shapes, a wrong key
        entry.write_bytes(
            [
                b"\x00\xff not json",
                b'{"format": 1, "key": "x", "outcome": {"generic": [], "dtype_generic": true}}',
                json.dumps(
                    {"format": 1, "key": entry.stem, "outcome": {"generic": "all"}}
                ).encode(),
                b"",
                json.dumps(
                    {"key": entry.stem, "outcome": {"graph": broken, "reason": ""}}
                ).encode(),
            ][i % 5]
        )
    again = _child(tmp_path, str(cache))
    assert again == first  # checked as often as the first time, and the same results

    off = tmp_path / "unused"
    got = _child(tmp_path, "")
    assert got["checked"] == first["checked"]
    assert not off.exists()


def test_an_entry_holds_data_and_a_folder_others_may_write_to_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict_files.ENV, str(tmp_path / "mine"))
    verdict_files.save("k", {"generic": [4], "dtype_generic": True})
    (entry,) = (tmp_path / "mine").iterdir()
    assert json.loads(entry.read_text())["outcome"] == {"generic": [4], "dtype_generic": True}
    assert verdict_files.load("k") == {"generic": [4], "dtype_generic": True}
    assert verdict_files.load("other") is None

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(verdict_files.ENV, str(shared))
    assert verdict_files.folder() is None
    verdict_files.save("k", {"generic": [4]})
    assert list(shared.iterdir()) == []


def test_past_the_bound_the_least_recently_used_entries_go(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    monkeypatch.setattr(verdict_files, "MAX_FILES", 8)
    for i in range(8):
        verdict_files.save(f"k{i}", {"n": i})
        os.utime(verdict_files._file(str(tmp_path), f"k{i}")[0], (1000 + i, 1000 + i))
    assert verdict_files.load("k0") == {"n": 0}  # used: now the most recent
    verdict_files.save("k8", {"n": 8})  # the ninth: the least recent go, down to 6
    left = {k for k in (f"k{i}" for i in range(9)) if verdict_files.load(k) is not None}
    assert left == {"k0", "k4", "k5", "k6", "k7", "k8"}


def _writer(folder: str, n: int) -> None:
    os.environ[verdict_files.ENV] = folder
    for i in range(50):
        verdict_files.save(f"shared {i % 5}", {"generic": [i % 5 + 1], "dtype_generic": True})
        verdict_files.save(f"own {n} {i}", {"generic": [n + 1], "dtype_generic": False})


def test_concurrent_writers_leave_whole_entries(tmp_path, monkeypatch):
    folder = str(tmp_path)
    monkeypatch.setenv(verdict_files.ENV, folder)
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_writer, args=(folder, n)) for n in range(3)]
    threads = [threading.Thread(target=_writer, args=(folder, n)) for n in range(3, 6)]
    for w in procs + threads:
        w.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for t in threads:
        t.join(60)
    names = os.listdir(folder)
    assert not [n for n in names if n.startswith(".tmp-")]
    assert len(names) == 5 + 6 * 50
    for i in range(5):
        assert verdict_files.load(f"shared {i}") == {"generic": [i + 1], "dtype_generic": True}
    for n in range(6):
        assert all(
            verdict_files.load(f"own {n} {i}") == {"generic": [n + 1], "dtype_generic": False}
            for i in range(50)
        )


def _helper(x):
    return x + 1


def _other_helper(x):
    return x + 2


def test_the_code_digest_follows_what_the_forward_calls_and_reads():
    if sys.gettrace() is not None:
        pytest.skip("another tracer (coverage, a debugger) is in place: Calls leaves it")

    def forward(x):
        return _helper(x) * LIMIT_LIKE  # noqa: F821 - defined below, then removed

    before = code_hash.digest([], [forward])
    assert code_hash.digest([], [forward]) == before
    global _helper
    saved = _helper
    try:
        _helper = _other_helper  # the same name, other code
        assert code_hash.digest([], [forward]) != before
    finally:
        _helper = saved
    assert code_hash.digest([], [forward]) == before
    globals()["LIMIT_LIKE"] = 4.0
    assert code_hash.digest([], [forward]) != before
    del globals()["LIMIT_LIKE"]

    calls = code_hash.Calls()
    with calls:
        _other_helper(1)
    assert any(code is _other_helper.__code__ for code, _ in calls.codes())
    assert code_hash.digest(calls.codes(), []) != code_hash.digest([], [])
    assert sys.gettrace() is None
    unwanted = code_hash.Calls(False)  # the files off: no tracer at all
    with unwanted:
        assert sys.gettrace() is None
        _other_helper(1)
    assert not unwanted.ok and unwanted.codes() == []


@pytest.mark.parametrize("value", [np.arange(3.0), (1, "a"), 2.5])
def test_the_digest_holds_simple_constants_by_value(value):
    def make(v):
        def forward(x):
            return x * v

        return forward

    assert code_hash.digest([], [make(value)]) == code_hash.digest([], [make(value)])
    other = value + 1 if not isinstance(value, tuple) else (2, "a")
    assert code_hash.digest([], [make(value)]) != code_hash.digest([], [make(other)])


def _focal_without_normalizer():
    from customop import ops

    return next(v for v in ops.focal_loss.variants.values() if "normalizer" in v.op_type)


LIBRARY_CASES = [
    ("box_iou", [(48, 4), (2, 3, 4)]),
    ("focal_loss~without_normalizer", [(2, 48, 3), (2, 48)]),
    ("box_encode", [(2, 48), (2, 48), (2, 48, 4), (2, 3, 4), (4,), (4,)]),
    ("box_decode", [(2, 10, 4), (1, 10, 4)]),
    ("smooth_l1", [(2, 48, 4), (1,), (2, 48, 4)]),
]


@pytest.mark.parametrize("purpose", ["train", "export"])
@pytest.mark.parametrize("name,shapes", LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_a_library_graph_reads_back_equal_to_the_traced_one(name, shapes, purpose):
    from customop import ops
    from customop.graphs import graph_verdicts, saved_graphs, trace

    op = _focal_without_normalizer() if "~" in name else getattr(ops, name)
    assert saved_graphs.library(op)
    shapes = tuple(tuple(s) for s in shapes)
    dtypes = tuple(np.dtype("float32") for _ in shapes)
    verdict = trace.aside(graph_verdicts._decide, op, {}, shapes, dtypes, purpose, None)
    assert verdict.graph is not None, verdict.reason
    data = json.loads(json.dumps(saved_graphs.data_of(verdict.graph)))  # as on disk
    back = saved_graphs.graph_of(data)
    for graph, other in [(verdict.graph, back), (verdict.graph.forward_only, back.forward_only)]:
        if graph is None:
            assert other is None
            continue
        assert repr(other.nodes) == repr(graph.nodes)  # tuples stay tuples
        assert repr(other.heads) == repr(graph.heads)
        assert sorted(other.constants) == sorted(graph.constants)
        for k, a in graph.constants.items():
            b = other.constants[k]
            assert (b.dtype, b.shape, b.tobytes()) == (a.dtype, a.shape, a.tobytes())
        for field in ("specialized", "checks", "guards", "dtype_generic", "generic", "note"):
            assert repr(getattr(other, field)) == repr(getattr(graph, field)), field
        assert repr(other.differentiates) == repr(graph.differentiates)


def test_an_op_of_the_users_or_holding_the_users_code_is_not_the_librarys():
    from customop import customop, ops
    from customop.graphs import saved_graphs

    @customop("mxnet")
    def twice(x):
        return x * 2

    assert not saved_graphs.library(twice)
    assert saved_graphs.library(ops.box_iou)
    wrapped = ops.box_iou.fn

    def users(*a):
        return wrapped(*a)

    class Op:  # an operator whose forward is the user's, calling the library's
        fn, grads = users, {}

    assert not saved_graphs.library(Op())


def test_a_saved_graph_that_is_not_one_reads_as_none():
    from customop.graphs import saved_graphs
    from customop.symbol_json import NativeGraph

    good = saved_graphs.data_of(
        NativeGraph(
            [{"op": "relu", "name": "r", "attrs": {}, "inputs": [("in", 0)]}], [("node", 0, 0)]
        )
    )
    assert saved_graphs.graph_of(json.loads(json.dumps(good))).heads == [("node", 0, 0)]
    for bad in [
        {"nodes": [{"op": "relu", "name": "r", "attrs": {}, "inputs": [["node", 0, 0]]}]},
        {"nodes": [{"op": "relu", "name": "r", "attrs": {"a": 1}, "inputs": []}]},
        {"nodes": [{"op": 3, "name": "r", "attrs": {}, "inputs": []}]},
        {"heads": [["const", "c"]]},
        {"checks": "1"},
        {"extra": 1},
    ]:
        with pytest.raises((ValueError, TypeError, KeyError, AttributeError)):
            saved_graphs.graph_of(dict(good, **bad))


def test_a_library_verdict_saved_under_other_source_or_parameters_is_not_taken(
    tmp_path, monkeypatch
):
    from customop import ops
    from customop.graphs import code_hash, graph_verdicts, saved_graphs

    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    shapes, dtypes = ((2, 10, 4), (1, 10, 4)), (np.dtype("float32"),) * 2
    graph_verdicts.clear_cache()
    verdict = graph_verdicts.native_graph(ops.box_decode, {}, shapes, dtypes, "train")
    assert verdict.inlines
    found = saved_graphs.recalled(ops.box_decode, {}, shapes, dtypes, "train")
    assert found is not None and repr(found["graph"].nodes) == repr(verdict.graph.nodes)
    assert saved_graphs.recalled(ops.box_decode, {"std0": 0.5}, shapes, dtypes, "train") is None
    assert saved_graphs.recalled(ops.box_decode, {}, shapes, dtypes, "export") is None
    monkeypatch.setattr(code_hash, "customop_source", lambda: "another source")
    assert saved_graphs.recalled(ops.box_decode, {}, shapes, dtypes, "train") is None
    graph_verdicts.clear_cache()


def test_customops_source_digest_is_read_back_while_no_file_changed(monkeypatch, tmp_path):
    # Issue 55: a process whose source files all have the sizes and modification times an
    # earlier process read takes its digest (a stat a file, no read); any other stamp reads.
    monkeypatch.setenv("CUSTOMOP_VERDICT_CACHE", str(tmp_path))
    monkeypatch.setattr(code_hash, "_source", [])
    digest = code_hash.customop_source()
    files = [
        os.path.join(folder, name)
        for folder in code_hash.source_folders()
        for name in sorted(os.listdir(folder))
        if name.endswith(".py")
    ]
    want = hashlib.sha256()
    for path in files:  # what the digest is: every file's name and bytes
        with open(path, "rb") as f:
            want.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    assert digest == want.hexdigest()
    reads = []
    read = code_hash._read_digest
    monkeypatch.setattr(code_hash, "_read_digest", lambda files: reads.append(1) or read(files))
    monkeypatch.setattr(code_hash, "_source", [])
    assert code_hash.customop_source() == digest and reads == []
    stamps = code_hash._stamps
    monkeypatch.setattr(
        code_hash, "_stamps", lambda files: [[p, n, t + 1] for p, n, t in stamps(files)]
    )
    monkeypatch.setattr(code_hash, "_source", [])
    assert code_hash.customop_source() == digest and reads == [1]  # a touched file: read again


def _smooth_l1_sigma_grad(x, sigma):  # d/dsigma of sum(smooth_l1(x, sigma)), float64
    x = np.asarray(x, np.float64)
    near = np.abs(x) < 1.0 / sigma**2
    return float(np.where(near, sigma * x**2, 1.0 / sigma**3).sum())


def test_a_registration_with_other_no_grad_or_inline_does_not_take_anothers_saved_verdict(
    tmp_path, monkeypatch
):
    # Review of issue 55: one library forward registered twice under one name with other
    # no_grad (or inline=False) took the other registration's saved graph (or refusal).
    import mxnet as mx

    from customop import customop, ops
    from customop.graphs import graph_verdicts, saved_graphs

    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    x_np, sigma = [[-2.0, 0.1, 0.5]], 2.0

    def sigma_grad(**kw):
        graph_verdicts.clear_cache()
        op = customop("mxnet", name="test.reg_l1", optional=("weight",), **kw)(ops.smooth_l1.fn)
        x, s = mx.nd.array(x_np), mx.nd.array([sigma])
        x.attach_grad()
        s.attach_grad()
        with mx.autograd.record():
            y = op(x, s)
        y.backward()
        return float(s.grad.asnumpy()[0])

    assert sigma_grad(no_grad=("sigma", "weight")) == 0.0
    assert sigma_grad(no_grad=("weight",)) == pytest.approx(_smooth_l1_sigma_grad(x_np, sigma))

    shapes, dtypes = [(2, 3), (1,)], ["float32", "float32"]

    def verdict(**kw):
        graph_verdicts.clear_cache()
        op = customop("mxnet", name="test.reg_l1", optional=("weight",), **kw)(ops.smooth_l1.fn)
        return graph_verdicts.native_graph(op, {}, shapes, dtypes, "train")

    assert verdict(no_grad=("sigma", "weight")).inlines  # saved
    other = customop("mxnet", name="test.reg_l1", optional=("weight",), no_grad=("weight",))(
        ops.smooth_l1.fn
    )
    assert saved_graphs.recalled(other, {}, shapes, dtypes, "train") is None
    assert verdict(no_grad=("sigma",), inline=False).rule == "inline-false"
    assert verdict(no_grad=("sigma",)).inlines  # not the other's refusal
    assert verdict(no_grad=("sigma",), inline=False).rule == "inline-false"  # not its graph
    graph_verdicts.clear_cache()


def test_source_changed_since_the_import_or_missing_keys_nothing(monkeypatch, tmp_path):
    # Review of issue 55: a checkout while a process runs changed the files, not the code in
    # memory; graphs traced by the old code were saved under the new files' digest.
    from customop import ops
    from customop.graphs import graph_verdicts, saved_graphs

    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    files = [
        os.path.join(folder, name)
        for folder in code_hash.source_folders()
        for name in os.listdir(folder)
        if name.endswith(".py")
    ]
    newest = max(os.stat(p).st_mtime_ns for p in files)
    monkeypatch.setattr(code_hash, "_imported_ns", lambda: newest - 1)  # one changed after it
    monkeypatch.setattr(code_hash, "_source", [])
    assert code_hash.customop_source() is None
    shapes, dtypes = ((2, 10, 4), (1, 10, 4)), (np.dtype("float32"),) * 2
    graph_verdicts.clear_cache()
    assert graph_verdicts.native_graph(ops.box_decode, {}, shapes, dtypes, "train").inlines
    assert saved_graphs.recalled(ops.box_decode, {}, shapes, dtypes, "train") is None
    assert list(tmp_path.iterdir()) == []  # nothing saved
    graph_verdicts.clear_cache()

    def gone(files):
        raise FileNotFoundError(files[0])

    monkeypatch.setattr(code_hash, "_imported_ns", lambda: newest)
    monkeypatch.setattr(code_hash, "_stamps", gone)  # a file removed mid-checkout
    monkeypatch.setattr(code_hash, "_source", [])
    assert code_hash.customop_source() is None


def test_packages_installed_inside_the_standard_librarys_folder_are_read_not_named(monkeypatch):
    # Review of issue 55: with site-packages inside the stdlib folder (python.org, Docker and
    # conda layouts) a user's installed op package dropped out of the digest.
    import sysconfig

    base = {k: "/usr/local" for k in ("base", "installed_base", "platbase", "installed_platbase")}
    paths = sysconfig.get_paths(scheme="posix_prefix", vars=base)
    monkeypatch.setattr(code_hash, "_STDLIB", (paths["stdlib"], paths["platstdlib"]))

    def made(source, folder):
        globs = {"__name__": "userpkg.loss"}
        exec(compile(source, os.path.join(folder, "userpkg", "loss.py"), "exec"), globs)
        return globs["f"]

    two = made("def f(x):\n    return 2 * x\n", paths["purelib"])
    three = made("def f(x):\n    return 3 * x\n", paths["purelib"])
    assert paths["purelib"].startswith(paths["stdlib"])
    assert code_hash.digest([], [two]) != code_hash.digest([], [three])
    stdlib_two = made("def f(x):\n    return 2 * x\n", paths["stdlib"])  # the stdlib: named
    stdlib_three = made("def f(x):\n    return 3 * x\n", paths["stdlib"])
    assert code_hash.digest([], [stdlib_two]) == code_hash.digest([], [stdlib_three])


def test_the_bound_leaves_other_files_and_odd_entries_are_misses(tmp_path, monkeypatch):
    # Review of issue 55: a data folder's own JSON files were deleted past the bound; deep
    # nesting raised RecursionError; a FIFO named like an entry hung; a read-only folder
    # turned hits into misses.
    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    monkeypatch.setattr(verdict_files, "MAX_FILES", 4)
    for i in range(6):
        mine = tmp_path / f"my_data_{i}.json"
        mine.write_text("{}")
        os.utime(mine, (1, 1))
    for i in range(6):
        verdict_files.save(f"k{i}", {"n": i})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.startswith("my_data_")] == [f"my_data_{i}.json" for i in range(6)]
    assert len(names) - 6 <= 4

    deep = verdict_files._file(str(tmp_path), "deep")[0]
    Path(deep).write_text("[" * 100000 + "]" * 100000)
    assert verdict_files.load("deep") is None  # (RecursionError inside: a miss)
    fifo = verdict_files._file(str(tmp_path), "fifo")[0]
    os.mkfifo(fifo)
    code = (
        "import os, sys; os.environ['CUSTOMOP_VERDICT_CACHE'] = sys.argv[1]\n"
        "from customop.graphs import verdict_files\n"
        "print(verdict_files.load('fifo'))\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0 and got.stdout.strip() == "None", got.stderr

    verdict_files.save("kept", {"n": 1})

    def refused(*a, **k):
        raise PermissionError("a read-only folder")

    monkeypatch.setattr(os, "utime", refused)  # (root may write a 0500 folder: refused here)
    assert verdict_files.load("kept") == {"n": 1}  # a hit still


@pytest.mark.parametrize(
    "outcome",
    [
        '{"graph": {"nodes": [], "heads": [], "constants": {}, "generic": [1e999]}}',
        '{"value": ["<f4", [Infinity], "AAAA"]}',
        '{"graph": {"nodes": [{"op": "null", "name": "x", "inputs": []}], "arg_nodes": [0],'
        ' "heads": [[0, 0, 0]]}, "inlined": [], "switches": [], "dtype_generic": true,'
        ' "input_shapes": {"x": [Infinity]}}',  # (int(inf): OverflowError)
    ],
)
def test_corrupt_saved_graphs_splices_and_constants_are_misses(tmp_path, monkeypatch, outcome):
    from customop import ops
    from customop.graphs import saved_constants, saved_graphs, saved_splices

    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))

    def planted(key):
        path, digest = verdict_files._file(str(tmp_path), key)
        Path(path).write_text(f'{{"format": 1, "key": "{digest}", "outcome": {outcome}}}')

    shapes, dtypes = ((2, 10, 4), (1, 10, 4)), (np.dtype("float32"),) * 2
    planted(saved_graphs._key(ops.box_decode, {}, shapes, dtypes, "train"))
    assert saved_graphs.recalled(ops.box_decode, {}, shapes, dtypes, "train") is None
    planted("splice")
    assert saved_splices.recalled("splice", {"nodes": [{"op": "null", "name": "x"}]}) is None
    part = {"nodes": [{"op": "_full", "name": "c", "inputs": [], "attrs": {"shape": "(2,)"}}]}
    part["heads"] = [[0, 0, 0]]
    planted(saved_constants._key(part))
    assert saved_constants._array(verdict_files.load(saved_constants._key(part))) is None


def test_a_process_lists_the_folder_at_its_first_save_and_past_the_bound(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    monkeypatch.setattr(verdict_files, "MAX_FILES", 6)
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(path) or scandir(path))
    for i in range(6):
        verdict_files.save(f"k{i}", {"n": i})
        os.utime(verdict_files._file(str(tmp_path), f"k{i}")[0], (1000 + i, 1000 + i))
    assert len(listed) == 1  # (its first save)
    verdict_files.save("k6", {"n": 6})  # the seventh: listed, the least recent go, down to 4
    assert len(listed) == 2
    left = {k for k in (f"k{i}" for i in range(7)) if verdict_files.load(k) is not None}
    assert left == {"k3", "k4", "k5", "k6"}
