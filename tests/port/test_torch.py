"""customop.to_torch: every library op's forward and gradient against MXNet's."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the port tests need torch (pip install 'customop[port]')"
)

from customop import ops  # noqa: E402
from customop.port import PortError, to_torch  # noqa: E402

from .cases import CASES, IDS, R, mxnet_reference  # noqa: E402


def _torch_run(port, inputs, params, grads, heads, device="cpu"):
    xs = [torch.tensor(a, device=device, requires_grad=i in grads) for i, a in enumerate(inputs)]
    out = port(*xs, **params)
    outs = list(out) if isinstance(out, tuple) else [out]
    if grads:
        torch.autograd.backward(
            [o for o in outs if o.requires_grad],
            [torch.tensor(h, device=device) for h, o in zip(heads, outs) if o.requires_grad],
        )
    return ([o.detach().cpu().numpy() for o in outs], [xs[i].grad.cpu().numpy() for i in grads])


def port_of(op, params):
    """The op's port with the parameters it needs fixed; the rest are passed per call."""
    fix = {
        k: v
        for k, v in params.items()
        if k in op.signature.required or callable(op.outputs.declared)
    }
    return to_torch(op, **fix), {k: v for k, v in params.items() if k not in fix}


def _close(got, want, what):
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradient_equal_mxnet(case, device="cpu"):
    _, name, make, params, grads = case
    op = getattr(ops, name)
    inputs = make(R(0))
    outs, heads, want = mxnet_reference(op, inputs, params, grads)
    port, params = port_of(op, params)
    got_outs, got = _torch_run(port, inputs, params, grads, heads, device)
    for k, (g, w) in enumerate(zip(got_outs, outs)):
        _close(g, w, f"output {k}")
    for i, g, w in zip(grads, got, want):
        _close(g, w, f"gradient of input {i}")


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradient_on_cuda(case):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    test_forward_and_gradient_equal_mxnet(case, device="cuda")


OPCHECK = [c[0] for c in CASES if c[4]]  # every case with a gradient


@pytest.mark.parametrize(
    "case", [c for c in CASES if c[0] in OPCHECK], ids=[i for i in IDS if i in OPCHECK]
)
def test_opcheck(case):
    _, name, make, params, grads = case
    inputs = make(R(0))
    xs = [torch.tensor(a, requires_grad=i in grads) for i, a in enumerate(inputs)]
    port, params = port_of(getattr(ops, name), params)
    torch.library.opcheck(port, tuple(xs), params)


def test_compile_fullgraph_gives_eager_values_and_gradients():
    port = to_torch(ops.focal_loss)
    pred, label = (torch.tensor(a) for a in CASES[0][2](R(3)))
    pred.requires_grad_(True)

    def step(p, lab):
        return port(p, lab, gamma=1.5).sum()

    eager = step(pred, label)
    (g_eager,) = torch.autograd.grad(eager, pred)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(pred, label)
    (g_comp,) = torch.autograd.grad(compiled, pred)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(g_comp, g_eager)


def _compiled_graphs(step, *args, grad=True):
    """``step`` compiled (AOTAutograd, no inductor, no cache) on ``args``: its value, the
    gradient of its sum wrt ``args[0]`` (``grad``), and the forward graph's operators."""
    from torch._functorch.aot_autograd import aot_module_simplified

    seen = []

    def keep(gm, _):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    def backend(gm, example):
        return aot_module_simplified(gm, example, fw_compiler=keep, bw_compiler=lambda g, _: g)

    x = args[0].detach().requires_grad_(grad)
    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend=backend)(x, *args[1:])
    return out, torch.autograd.grad(out.sum(), x)[0] if grad else None, seen


def test_compile_traces_the_op_as_torch_operators_and_keeps_its_own_gradient():
    """Inductor sees the forward graph's operators, not one opaque call; the gradient is
    still the closure's (a surrogate here: 3, where the forward's derivative is not)."""
    import mxnet as mx

    from customop import customop

    @customop("mxnet", name="tests.port.soft_surrogate")
    def soft(x):
        return mx.nd.Activation(x, act_type="softrelu") + mx.nd.sigmoid(-x)

    soft.def_grad(lambda ans, x: lambda g: g * 3.0)
    port = to_torch(soft)
    x = torch.tensor(np.random.RandomState(0).randn(4, 5).astype(np.float32))
    out, g, ops_seen = _compiled_graphs(lambda v: port(v), x)
    assert not any("customop" in t for t in ops_seen), ops_seen
    assert "aten.exp.default" in ops_seen
    want = np.logaddexp(0, x.double().numpy()) + 1 / (1 + np.exp(x.double().numpy()))
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=2e-5)
    torch.testing.assert_close(g, torch.full_like(x, 3.0), rtol=0, atol=0)


def test_compile_keeps_a_numpy_mode_op_one_call_and_its_gradient():
    """The host code runs as two opaque calls, the forward and its own backward op (the
    backward cannot read traced tensors)."""
    from customop import customop

    @customop("numpy", name="tests.port.np_cube")
    def cube(x, *, scale=1.0):
        return scale * x * x * x

    port = to_torch(cube)
    x = torch.tensor([0.5, -2.0, 3.0])
    out, g, ops_seen = _compiled_graphs(lambda v: port(v, scale=2.0), x)
    assert any("np_cube" in t for t in ops_seen), ops_seen
    torch.testing.assert_close(out, 2 * x**3)
    torch.testing.assert_close(g, 6 * x**2)


def test_the_device_of_made_tensors_is_per_thread():
    import threading

    from customop.port import torch_rules

    torch_rules.DEVICE.value = torch.device("meta")
    try:
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch_rules.DEVICE.value))
        t.start()
        t.join()
        assert seen == [None]
    finally:
        torch_rules.DEVICE.value = None


def test_integer_labels_get_no_gradient_and_optional_input_may_be_none():
    port = to_torch(ops.focal_loss)
    pred, label = (torch.tensor(a) for a in CASES[0][2](R(4)))
    pred.requires_grad_(True)
    out = port(pred, label, None)
    out.sum().backward()
    assert pred.grad is not None and not label.requires_grad


def test_value_checks_give_nan_as_native_graphs_do():
    pred, label = (torch.tensor(a) for a in CASES[0][2](R(5)))
    label[0, 0] = 7.0  # outside {ignore_label, 0..C}
    out = to_torch(ops.focal_loss)(pred, label)
    assert torch.isnan(out).any()


def test_aux_state_op_is_a_named_error():
    with pytest.raises(PortError, match="ops.center_loss.*auxiliary states"):
        to_torch(ops.center_loss, num_class=5)


def test_required_parameter_must_be_fixed():
    with pytest.raises(TypeError, match="ops.tile.*'reps'"):
        to_torch(ops.tile)


def test_numpy_mode_op_runs_on_the_host():
    op = ops.focal_loss.numpy
    inputs = CASES[0][2](R(6))
    outs, heads, want = mxnet_reference(op, inputs, {}, [0])
    got_outs, got = _torch_run(to_torch(op), inputs, {}, [0], heads)
    _close(got_outs[0], outs[0], "output")
    _close(got[0], want[0], "gradient")


def test_shape_and_dtype_errors_name_the_op():
    port = to_torch(ops.focal_loss)
    with pytest.raises(TypeError, match=r"'ops.focal_loss.*\(port\).*pred"):
        port(torch.zeros(2, 3, 4, dtype=torch.int32), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"'ops.focal_loss.*\(port\).*label"):
        port(torch.zeros(2, 3, 4), torch.zeros(2, 4))


def test_a_second_backward_runs_the_graph_again_and_no_grad_calls_keep_little():
    from customop.port import torch_port

    port = to_torch(ops.focal_loss)
    pred, label = (torch.tensor(a) for a in CASES[0][2](R(7)))
    pred.requires_grad_(True)
    total = port(pred, label).sum()
    (first,) = torch.autograd.grad(total, pred, retain_graph=True)  # the kernel's graph
    (second,) = torch.autograd.grad(total, pred)  # run again from the saved inputs
    torch.testing.assert_close(first, second)
    with torch.no_grad():  # the kernel cannot tell: what it records waits, bounded
        for _ in range(3 * torch_port._PENDING_MAX):
            port(pred, label)
    assert len(torch_port._pending) <= torch_port._PENDING_MAX


def test_repeated_calls_at_other_shapes_and_keywords_match_mxnet():
    """The kernel remembers each call signature's graph: a call like an earlier one skips the
    lookup, and must still get its own shapes' and keywords' graph."""
    port = to_torch(ops.focal_loss)
    for n, gamma in [(2, 2.0), (3, 2.0), (2, 1.5), (2, 2.0)]:
        inputs = CASES[0][2](R(n))[:1] + [R(n).randint(-1, 4, (n, 6)).astype("f")]
        inputs[0] = R(n + 10).randn(n, 6, 3).astype("f")
        outs, heads, want = mxnet_reference(ops.focal_loss, inputs, {"gamma": gamma}, [0])
        got_outs, got = _torch_run(port, inputs, {"gamma": gamma}, [0], heads)
        _close(got_outs[0], outs[0], f"output at n={n}, gamma={gamma}")
        _close(got[0], want[0], f"gradient at n={n}, gamma={gamma}")
    with pytest.raises(ValueError, match=r"'ops.focal_loss.*\(port\).*label"):
        port(torch.zeros(2, 6, 3), torch.zeros(2, 5))  # after a good call at (2, 6, 3)


def test_box_nms_suppressed_box_suppresses_nothing():
    """A chain: A suppresses B, B overlaps C, C is kept (only kept boxes suppress); checked
    against MXNet's own box_nms, with more boxes than the loop's lead-in."""
    import mxnet as mx

    r = R(8)
    chain = np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.8, 0, 5, 10, 15], [0, 0.7, 0, 10, 10, 20]], "f")
    rest = np.concatenate(
        [
            np.zeros((60, 1)),
            r.rand(60, 1) * 0.6,
            np.concatenate([lo := r.uniform(20, 60, (60, 2)), lo + r.uniform(2, 9, (60, 2))], 1),
        ],
        1,
    )
    data = np.concatenate([chain, rest.astype("f")])[None]
    want = mx.nd.contrib.box_nms(mx.nd.array(data), overlap_thresh=0.3).asnumpy()
    got = to_torch(ops.box_nms)(torch.tensor(data), overlap_thresh=0.3).numpy()
    assert (want[0, :, 1] == 0.7).any()  # C kept by MXNet
    _close(got, want, "box_nms")
