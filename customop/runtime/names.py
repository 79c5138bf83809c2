"""The ``names`` patch: the name lists our props hand MXNet stay alive while MXNet reads them.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=names``; installed by the first graph node or
``mx.nd.Custom`` call of one of our ops.

MXNet's Python ``list_arguments_entry``, ``list_outputs_entry`` and
``list_auxiliary_states_entry`` hand C++ a fresh ``char**`` of names and keep it
in one slot per prop (``_ref_holder``).  C++ asks for them whenever it needs a
node's input or output names (``Symbol.list_outputs``, each bind), so two
threads using one Symbol call the same prop's entry concurrently, and the
second call frees the first call's array while C++ still copies its strings:
threads calling ``list_outputs()`` on one Symbol holding a hand-written CustomOp
died (segmentation fault, bus error) or read garbage names (``UnicodeDecodeError``),
on ``ops.focal_loss`` alike, and threads binding one Symbol of our ops aborted the
process (``double free or corruption``, ``corrupted double-linked list``) with the
``shapes`` fix in place (measured: docs/design.md, *What customop changes in MXNet*).
A prop's names never change, so for each prop of *ours* only, the three list slots of
the callback table MXNet made for it are pointed at entries that build each list once
and keep it with the prop, for as long as MXNet holds the prop.  Switched off,
concurrent users of one Symbol share MXNet's slots again.
"""

from __future__ import annotations

from typing import Any

from . import callbacks

_props: dict[int, Any] = {}  # context key -> weak reference to a prop of ours


def _entry(method: str) -> Any:
    # MXNet's list_*_entry for prop method ``method``, handing C++ an array kept with the prop.
    @callbacks.guarded
    def list_entry(out, key, props=_props):
        ref = props.get(key or 0)
        prop = ref() if ref is not None else None
        if prop is None:  # pragma: no cover - MXNet calls a prop only while it holds it
            return False
        kept = prop.__dict__.setdefault("_customop_names", {})
        found = kept.get(method)
        if found is None:
            # setdefault: a concurrent first call keeps the array the other one handed out
            found = kept.setdefault(method, callbacks.string_array(getattr(prop, method)()))
        callbacks.answer_strings(found, out)
        return True

    return list_entry


# slot -> (entry name, C type, function): the C callbacks install() makes
_SLOTS = {
    slot: (method, callbacks.LIST_TYPE, _entry(method))
    for slot, method in (
        (callbacks.PROP_LIST_ARGUMENTS, "list_arguments"),
        (callbacks.PROP_LIST_OUTPUTS, "list_outputs"),
        (callbacks.PROP_LIST_AUX, "list_auxiliary_states"),
    )
}


def adopt_prop(refs: Any, prop: Any) -> None:
    """MXNet created ``prop``, a prop of ours: point its three list slots at our entries.

    ``refs``: what MXNet's ``creator`` callback stores as the prop's ``_ref_holder``.
    """
    callbacks.adopt("names", refs, _SLOTS, lambda: callbacks.weak_key(_props, prop))


def install() -> None:
    """Make the three C callbacks (list arguments, outputs, aux states) props of ours get."""
    for name, ctype, fn in _SLOTS.values():
        callbacks.entry(name, ctype, fn)
