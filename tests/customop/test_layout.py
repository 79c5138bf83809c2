"""The core is split by job: no import circle, no private names across modules, and a call
never comes back into the operator definition once dispatch has it."""

import ast
import os
import re
import sys
import threading
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop.dispatch import forced_path

PKG = Path(customop.__file__).resolve().parent


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _is_type_checking(node):
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in (
        getattr(test, "id", None),
        getattr(test, "attr", None),
    )


def _run_time_imports(name, path):
    """(module, imported names) for every import of a customop module outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    stack = [n for n in tree.body if not _is_type_checking(n)]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if any(m == sub for m, _ in _modules()) else target, alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("customop"):
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, (ast.If, ast.Try, ast.FunctionDef, ast.ClassDef, ast.With)):
            stack += [n for n in ast.iter_child_nodes(node) if not _is_type_checking(n)]
    return found


def test_no_import_circle():
    graph = {
        name: {m for m, _ in _run_time_imports(name, path) if m != name}
        for name, path in _modules()
    }
    done, active = set(), []

    def visit(node):
        if node in active:
            raise AssertionError(
                "import circle: " + " -> ".join(active[active.index(node) :] + [node])
            )
        if node in done:
            return
        active.append(node)
        for dep in sorted(graph.get(node, ())):
            visit(dep)
        active.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_no_module_imports_another_modules_private_names():
    offenders = []
    names = [n.rsplit(".", 1)[-1] for n, _ in _modules()]
    alternatives = "|".join(map(re.escape, names))
    private_use = re.compile(r"(?<![\w.])(" + alternatives + r")\._[a-z]\w*")
    for name, path in _modules():
        for module, imported in _run_time_imports(name, path):
            if imported.startswith("_") and imported != "__version__":
                offenders.append(f"{name} imports {module}.{imported}")
        for line in path.read_text().splitlines():
            for match in private_use.finditer(line):
                if not line.lstrip().startswith("#"):
                    offenders.append(f"{name} uses {match.group(0)}")
    assert offenders == []


def _private_attributes(tree):
    """({private attribute names set}, {names read: line}) of a module: ``x._name = ...``,
    ``setattr(x, "_name", ...)``; ``x._name``, ``getattr``/``hasattr(x, "_name")``."""
    set_, read = set(), {}
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name, stores = node.attr, isinstance(node.ctx, ast.Store)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, stores = node.args[1].value, node.func.id == "setattr"
        if name and name.startswith("_") and not name.startswith("__"):
            if stores:
                set_.add(name)
            else:
                read.setdefault(name, node.lineno)
    return set_, read


def test_no_module_reads_a_private_attribute_another_module_sets():
    # (an attribute one module hangs on an object, read elsewhere, is a private name across
    # modules: aux_merge.py (then distributed/agree.py) once read the aux patch's executor
    # attribute; it now asks aux_merge.note_executor's record. A name two modules set for
    # their own objects is renamed in one, so that each private attribute has one owner)
    found = {name: _private_attributes(ast.parse(path.read_text())) for name, path in _modules()}
    offenders = [
        f"{name}:{line} reads {attr}, set in {other}"
        for name, (_, read) in found.items()
        for attr, line in read.items()
        for other, (set_, _) in found.items()
        if other != name and attr in set_
    ]
    assert offenders == []


@decorate("numpy")
def _square(x):
    return x * x


_square.def_grad(lambda ans, x: lambda g: 2 * x * g)


@decorate("mxnet")
def _square_nd(x):
    return x * x


def _calls_between_files(fn):
    """(caller file, callee file) for every call from one customop module into another."""
    edges = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_back is not None:
            callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
            if callee.startswith(str(PKG)) and caller.startswith(str(PKG)) and callee != caller:
                edges.add(
                    (
                        os.path.relpath(caller, PKG),
                        os.path.relpath(callee, PKG),
                        frame.f_code.co_name,
                    )
                )

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return edges


def _recorded(op, path):
    def run():
        x = mx.nd.ones((3,))
        x.attach_grad()
        with forced_path(path), mx.autograd.record():
            y = op(x)
        y.backward()
        x.grad.wait_to_read()

    return run


@pytest.mark.parametrize(
    "how", ["direct", "function", "native", "custom", "numpy", "symbol", "executor"]
)
def test_a_call_never_returns_into_the_operator_definition(how):
    runs = {
        "direct": lambda: _square(mx.nd.ones((3,))).wait_to_read(),
        "function": _recorded(_square, "function"),
        "native": _recorded(_square_nd, "native"),
        "custom": _recorded(_square, "custom"),
        "numpy": lambda: _square(np.ones(3)),
        "symbol": lambda: _square(mx.sym.var("x")),
        "executor": lambda: _square(mx.sym.var("x")).simple_bind(mx.cpu(), x=(3,)).forward(),
    }
    edges = _calls_between_files(runs[how])
    back = sorted(e for e in edges if e[1] == "operator.py" and e[0] != "__init__.py")
    assert back == [], "\n".join(back)
    if how not in ("symbol", "executor"):  # nothing / MXNet's worker thread runs the forward
        assert any(callee == "kernel.py" for _, callee, _ in edges)


def _reachable(start, graph):
    seen, stack = set(), [start]
    while stack:
        for dep in graph.get(stack.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


@decorate("mxnet")
def _inlined_square(x):
    return x * x


class _Squares(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return _inlined_square(x) + 1


def _block_first_call(block):
    block.hybridize()
    x = mx.nd.ones((4, 3))
    x.attach_grad()
    with mx.autograd.record():
        y = block(x)
    y.backward()
    mx.nd.waitall()


def _hybridized_first_call():
    _block_first_call(_Squares())
    exe = _inlined_square(mx.sym.var("x")).simple_bind(mx.cpu(), x=(3,))
    exe.forward(is_train=True)
    exe.backward(mx.nd.ones((3,)))
    mx.nd.waitall()


def test_runtime_calls_out_only_into_modules_it_imports():
    # The runtime is patched into MXNet far below the modules that use it. A call out of
    # customop/runtime/ must go where an import of the calling module shows it goes: a
    # module object or function handed over at run time (inlining.py once gave the runtime
    # ``sys.modules[__name__]`` and the runtime called four functions on it) hides the call.
    graph = {
        name: {m for m, _ in _run_time_imports(name, path) if m != name}
        for name, path in _modules()
    }
    module_of = {os.path.relpath(path, PKG): name for name, path in _modules()}
    edges = _calls_between_files(_hybridized_first_call)
    edges |= _calls_between_files(_recorded(_square, "custom"))

    def in_runtime(file):
        return file.split(os.sep)[0] in ("runtime", "runtime.py")

    # The one protocol the runtime calls up through: the methods of the operator and prop
    # objects MXNet creates for our ops (mx.operator.CustomOp, CustomOpProp), which release,
    # deps, names and shapes are handed with MXNet's callback table and call as MXNet's own
    # callbacks would.
    protocol = {
        ("prop.py", "backward"),
        ("prop.py", "release"),
        ("prop.py", "list_arguments"),
        ("prop.py", "list_outputs"),
        ("prop.py", "list_auxiliary_states"),
        ("prop.py", "infer_shape"),
    }
    out = set()
    for caller, callee, fn in edges:
        if not in_runtime(caller) or in_runtime(callee) or (callee, fn) in protocol:
            continue
        if module_of[callee] in _patch_modules():
            # a wing's patch: named in the runtime's index (install, wanted), or replacing
            # one of MXNet's functions, called by whoever calls MXNet's (another patch's
            # wrapper of the same function, installed after it)
            continue
        source, target = module_of[caller], module_of[callee]
        if target not in _reachable(source, graph):
            out.add(f"{source} calls {target}.{fn} without importing it")
    assert any(in_runtime(c) and not in_runtime(e) for c, e, _ in edges)  # the check ran
    assert sorted(out) == []


def test_no_module_hands_itself_over():
    # (customop/__init__.py sets its own class, the language's way to give a module a
    # __setattr__: that hands the module to nobody)
    offenders = [
        name
        for name, path in _modules()
        if re.search(r"sys\.modules\[__name__\](?!\.__class__ = )", path.read_text())
    ]
    assert offenders == []


MEASUREMENT = re.compile(r"\d+(\.\d+)?x\b|\d+(\.\d+)? ?(ms|µs|us)\b")


def _measurements(doc):
    return [m.group(0) for m in MEASUREMENT.finditer(doc or "")]


def test_no_module_docstring_carries_a_measurement():
    # measurements live in docs/design.md and BENCHMARKS.md; a docstring names where measured
    offenders = [
        f"{name}: {found}"
        for name, path in _modules()
        for found in [_measurements(ast.get_docstring(ast.parse(path.read_text())))]
        if found
    ]
    assert offenders == []


def test_the_measurement_check_sees_a_ratio_and_a_time():
    # dispatch.py's docstring as it was
    old = (
        "graph runs that graph instead (as on the ``graph`` path, not recorded): measured\n"
        "  0.75-0.85x the direct path's time for small ops (``x * x``, ``box_iou``), "
        "0.17-0.34x for\n  ops whose value checks read the host there"
    )
    assert _measurements(old) == ["0.85x", "0.34x"]
    assert _measurements("costs 0.02 ms, 13-65 us, 2µs") == ["0.02 ms", "65 us", "2µs"]
    assert _measurements("x * x, 1e3 elements, 2x50 input, max(x) ") == []


def _patch_modules():
    from customop import runtime

    return set(runtime.PATCHES.values())


def test_every_patch_is_a_module_with_its_reason_and_switch_in_the_runtime_or_a_wing():
    # (a patch that only a wing's feature needs lives in that wing, named in the index by
    # its full path: the runtime imports no wing)
    from customop import runtime

    for name, module in runtime.PATCHES.items():
        assert _layer(module) in ("runtime", "graphs", "deploy", "distributed", "port"), module
        path = PKG.parent / (module.replace(".", "/") + ".py")
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text))
        assert f"CUSTOMOP_RUNTIME_OFF={name}``" in doc, name
        # (a scoped patch installs nothing: in place only while its block runs)
        assert ("def install() -> None:" in text) == (name not in runtime.SCOPED), name
        if name in runtime.SCOPED:
            assert "in place only while" in doc, name
        else:
            assert not re.search(r"def install\(\) -> None:\n( .*\n)*? +pass\b", text), name
        assert f"``{name}``" in runtime.__doc__, name


# What changes MXNet or Python for everyone: an attribute of theirs set, a fork or exit hook,
# an entry of ours in one of MXNet's C callback tables.
_THEIRS = ("mx", "mxnet", "np", "numpy", "os", "random", "subprocess", "sys", "threading")
_HOOKS = ("os.register_at_fork", "atexit.register", "callbacks.entry")


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def _changes_to_mxnet_or_python(tree):
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        )
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                name = _dotted(t) if isinstance(t, ast.Attribute) else None
                if name and name.split(".")[0] in _THEIRS:
                    yield node.lineno, f"sets {name}"
        if isinstance(node, ast.Call):
            called = _dotted(node.func)
            if (
                called in _HOOKS
                or called == "setattr"
                and node.args
                and ((_dotted(node.args[0]) or "").split(".")[0] in _THEIRS)
            ):
                yield node.lineno, f"calls {called}"


def test_no_patch_code_lives_outside_its_module():
    # The index of customop.runtime names the one patch made elsewhere: excepthook, the
    # public function of customop.distributed.launch that its workers call at start-up
    # (its command line also sets sys.argv for MXNet's launch.py, which it runs as __main__).
    allowed = {
        ("customop.distributed.launch", "sets sys.excepthook"),
        ("customop.distributed.launch", "sets sys.argv"),
    }
    found = []
    for name, path in _modules():
        if name.startswith("customop.runtime") or name in _patch_modules():
            continue
        for line, what in _changes_to_mxnet_or_python(ast.parse(path.read_text())):
            if (name, what) not in allowed:
                found.append(f"{name}:{line} {what}")
    assert found == []


def test_the_c_entries_in_mxnets_tables_are_the_runtimes():
    # A patch's C callback (MXNet's table slot pointed at it) is a function of its module;
    # the recorded-function path of dispatch hands its own to callbacks.record_function.
    from customop.runtime import callbacks

    _recorded(_square, "custom")()
    _square(mx.sym.var("x")).simple_bind(mx.cpu(), x=(3,)).forward()
    made = {
        name: fn.__module__
        for name, fn in callbacks.entries().items()
        if not name.startswith("function-")
    }
    assert {"infer_shape", "list_outputs", "declare", "delete"} <= set(made)
    assert sorted(n for n, m in made.items() if not m.startswith("customop.runtime.")) == []


def test_the_layout_in_the_developers_guide_names_every_module():
    text = (PKG.parent / "docs" / "development.md").read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    missing = []
    for _, path in _modules():
        rel = path.relative_to(PKG)
        shown = (
            f"`{rel.parent.name}/`"
            if len(rel.parts) > 2 or rel.parent.name in ("check", "distributed")
            else f"`{rel.name}`"
        )
        if shown not in layout:
            missing.append(str(rel))
    assert missing == []


WINGS = ("graphs", "deploy", "port")
# What each layer may import: the core (customop/*.py) and the runtime sit at the bottom;
# graphs/ on them; deploy/ and port/ on graphs/; distributed/ and check/ are features on
# top. customop/__init__.py (the public names, each imported on first use) may import any.
MAY_IMPORT = {
    "core": {"core", "runtime"},
    "runtime": {"core", "runtime"},
    "graphs": {"core", "runtime", "graphs"},
    "deploy": {"core", "runtime", "graphs", "deploy"},
    "port": {"core", "runtime", "graphs", "port"},
    "distributed": {"core", "runtime", "distributed"},
    "check": {"core", "runtime", "graphs", "check"},
}


def _layer(name):
    parts = name.split(".")
    if len(parts) == 1:
        return None  # customop/__init__.py
    return parts[1] if parts[1] in MAY_IMPORT and parts[1] != "core" else "core"


def test_every_wing_names_its_entry_points():
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PKG / wing / "__init__.py").read_text()))
        assert doc and "Entry points" in doc, wing


def _name_clashes(paths):
    """Pairs of modules whose names repeat or differ only by a suffix (``bind``/``binding``,
    ``transpose``/``transposed``, ``closures``/``closure_values``), in any folders."""
    stems = [(p, p.stem[:-1] if p.stem.endswith("s") else p.stem) for p in paths]
    stems = [(p, s) for p, s in stems if p.stem not in ("__init__", "__main__")]
    return sorted(
        (str(a), str(b))
        for i, (a, x) in enumerate(stems)
        for b, y in stems[i + 1 :]
        if x.startswith(y) or y.startswith(x)
    )


def test_no_two_modules_names_repeat_or_differ_only_by_a_suffix():
    paths = sorted(p.relative_to(PKG) for p in PKG.rglob("*.py"))
    assert _name_clashes(paths) == []


def test_the_name_check_sees_a_suffix_and_a_repeat():
    pairs = _name_clashes(
        [Path(p) for p in ("a/trace.py", "b/trace.py", "transpose.py", "transposed.py")]
    )
    assert pairs == [("a/trace.py", "b/trace.py"), ("transpose.py", "transposed.py")]
    assert _name_clashes([Path(p) for p in ("closures.py", "closure_values.py")]) != []
    assert _name_clashes([Path(p) for p in ("binds.py", "binding.py", "x/__init__.py")]) != []
    assert _name_clashes([Path(p) for p in ("a/__init__.py", "b/__init__.py", "c.py")]) == []


def test_every_module_imports_only_its_layer_and_the_layers_below():
    offenders = []
    for name, path in _modules():
        mine = _layer(name)
        for module, _ in _run_time_imports(name, path):
            if mine is not None and _layer(module) not in MAY_IMPORT[mine]:
                offenders.append(f"{name} imports {module}")
    assert offenders == []


def test_the_layers_are_those_of_the_folders():
    folders = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(MAY_IMPORT) - {"core"}
    assert _layer("customop.dispatch") == "core" and _layer("customop.runtime") == "runtime"
    assert _layer("customop.graphs.inline") == "graphs" and _layer("customop") is None


def test_the_core_reaches_the_graph_path_only_through_its_name():
    # (dispatch names the module of its graph path as the runtime's index names a wing's
    # patch: imported by that name when the path first runs)
    from customop import dispatch

    assert _layer(dispatch.GRAPH_PATH) == "graphs"
    assert (PKG.parent / (dispatch.GRAPH_PATH.replace(".", "/") + ".py")).exists()


def test_no_private_name_is_reexported_under_a_public_alias():
    pattern = re.compile(r"^[A-Za-z]\w*(\s*,\s*[A-Za-z]\w*)*\s*=\s*_[A-Za-z]\w*(\s*,\s*_\w+)*\s*$")
    offenders = [
        f"{name}: {line}"
        for name, path in _modules()
        for line in path.read_text().splitlines()
        if pattern.match(line)
    ]
    assert offenders == []


def test_no_module_below_operator_names_the_operator_class():
    # they read an operator through customop.opinfo's protocols
    offenders = []
    for name, path in _modules():
        if name in ("customop", "customop.operator") or name.startswith("customop.check"):
            continue
        text = path.read_text()
        if re.search(r"import CustomOperator\b", text):
            offenders.append(name)
    assert offenders == [] or set(offenders) <= {"customop.graphs.explain"}, offenders


def test_a_def_grad_blocks_first_call_calls_back_only_through_declared_protocols():
    # A call from one module into another goes where the caller's imports show, or through
    # a protocol the caller declares for what it is handed: the builder verify.verified
    # checks (verify.Builder), the entries transpose.Transposer asks about
    # (transpose.Entries: the graph being transposed knows coefficients and zeros, asked
    # per rule), and the operator/prop objects MXNet creates
    # (mx.operator.CustomOp, CustomOpProp). trace.aside(fn, *args) is no callback up: an
    # executor (fn on the trace thread, as concurrent.futures runs a submitted function),
    # it knows nothing of what it runs; on the trace thread itself it calls fn, here
    # graph_verdicts._decide, directly
    from customop import runtime
    from customop.graphs import transpose, verify

    graph = {
        name: {m for m, _ in _run_time_imports(name, path) if m != name}
        for name, path in _modules()
    }
    module_of = {os.path.relpath(path, PKG): name for name, path in _modules()}
    declared = {m for m in dir(verify.Builder) if not m.startswith("_")}
    declared |= {"frozen"}  # forward.ForwardGraph's, which transposed.TransposedGraph extends
    declared |= {m for m in dir(transpose.Entries) if not m.startswith("_")}
    declared |= {
        "backward",
        "release",
        "list_arguments",
        "list_outputs",
        "list_auxiliary_states",
        "infer_shape",
        "infer_type",
        "declare_backward_dependency",
    }  # prop.py's objects, called by the runtime
    declared |= {"of", "names", "check_params"}  # an op's parts (opinfo.Forward)
    declared |= {"install", "wanted"}  # runtime.PATCHES' modules, imported by name
    declared |= {"invoked", "read", "pause_enter", "pause_exit"}  # runtime.hooks' log
    # (splice.ours/foreign look operators up in registry, which they import; symbol_json,
    # which imports no customop module, took a lookup function for them once)

    @decorate("mxnet")
    def surrogate(x):
        return x * x

    surrogate.def_grad(lambda ans, x: lambda g: 3 * x * g)  # not the derivative: transposed

    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return surrogate(x) + 1

    def first_call():
        _block_first_call(Net())

    # traces run on customop's trace thread, or inline on a thread of that name: profile one
    found = {}
    worker = threading.Thread(
        target=lambda: found.update(edges=_calls_between_files(first_call)),
        name="customop-trace-layout-test",
    )
    worker.start()
    worker.join(300)
    edges = found["edges"]
    crossed = sorted({module_of[c] for c, _, _ in edges} | {module_of[e] for _, e, _ in edges})
    assert "customop.graphs.backward" in crossed  # the transposed graph was built
    # (a patch replacing one of MXNet's functions is called by whoever calls MXNet's)
    patches = set(runtime.PATCHES.values())
    back = sorted(
        f"{module_of[c]} calls {module_of[e]}.{fn}"
        for c, e, fn in edges
        if module_of[e] not in _reachable(module_of[c], graph)
        and fn not in declared
        and module_of[c] != "customop"
        and module_of[e] not in patches
        and (module_of[c], fn) != ("customop.graphs.trace", "_decide")
    )
    assert back == [], "\n".join(back)


def test_every_subpackage_is_listed_for_the_wheel():
    # (a wing missing from pyproject.toml's packages imports in the checkout and fails in
    # every installed copy)
    text = (PKG.parent / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(customop(?:\.\w+)*)"', text[text.index("packages = [") :]))
    found = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert found - {n for n in listed} == set()


def _code_lines(node, text_lines):
    """Lines of ``node`` that hold code: no blank line, comment or docstring."""
    docs = set()
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    return [
        i
        for i in range(node.lineno, node.end_lineno + 1)
        if i not in docs
        and text_lines[i - 1].strip()
        and not text_lines[i - 1].strip().startswith("#")
    ]


def test_no_class_is_over_200_lines_of_code():
    offenders = []
    for name, path in _modules():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                count = len(_code_lines(node, lines))
                if count > 200:
                    offenders.append(f"{name}.{node.name}: {count}")
    assert offenders == []


def test_the_code_line_count_leaves_out_docstrings_comments_and_blank_lines():
    text = 'class A:\n    """Doc.\n\n    more\n    """\n\n    # why\n    x = 1\n'
    (node,) = ast.parse(text).body
    assert len(_code_lines(node, text.splitlines())) == 2  # class A:, x = 1


def test_the_public_paths_still_resolve():
    # what users and saved files name: every exported name, the check and launch commands'
    # modules, forced_path, the pickles' by_reference, and the CUSTOMOP_RUNTIME_OFF names
    import importlib.util

    from customop import runtime

    for name in customop.__all__:
        assert getattr(customop, name) is not None, name
    for module in ("customop.check", "customop.check.__main__", "customop.distributed.launch"):
        assert importlib.util.find_spec(module) is not None, module
    assert callable(importlib.import_module("customop.check").check_grad)
    assert callable(importlib.import_module("customop.dispatch").forced_path)
    assert callable(importlib.import_module("customop.registry").by_reference)
    switches = "errors fork aux auxsync release deps shapes names binds trace randomness inline"
    switches += " gluonshape isAlive onnxops backlog runahead"
    assert set(switches.split()) <= set(runtime.PATCHES)  # new switches may join, none go
