"""Strict torch.export shares parameters with Dynamo's real-value cache instead of cloning them (etsdk._export.tracing)."""

from __future__ import annotations

import threading

import pytest
import torch
from etsdk._export.tracing import weights_shared_while_tracing

builder = pytest.importorskip("torch._dynamo.variables.builder")


def test_scoped_to_the_thread_and_restored() -> None:
    original = builder._clone_input
    param = torch.nn.Parameter(torch.ones(3))
    buffer = torch.ones(3)
    other: list[bool] = []
    with weights_shared_while_tracing():
        assert builder._clone_input(param, None) is param  # shared
        assert builder._clone_input(buffer, None) is not buffer  # buffers (caches, counters) are still cloned
        worker = threading.Thread(target=lambda: other.append(builder._clone_input(param, None) is param))
        worker.start()
        worker.join()
        with weights_shared_while_tracing():  # nested use keeps it installed
            pass
        assert builder._clone_input(param, None) is param
    assert other == [False]  # another thread, outside the block, still clones
    assert builder._clone_input is original


def _parameter_bytes_cloned(shared: bool) -> tuple[int, int]:
    """Bytes of parameters that reached Dynamo's real-value clone during a strict export, and the weights' size.

    Counts at the mechanism instead of measuring RSS: peak RSS growth per weight byte was 2.3 here and 0.8 on the
    CI machine for the same export (allocator and memory-pressure dependent); benchmarks/*_export_memory.py
    measure the RSS effect on real models.
    """
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    original, seen = builder._clone_input, [0]

    def counting(value, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(value, torch.nn.Parameter):
            seen[0] += value.numel() * value.element_size()
        return original(value, *args, **kwargs)

    builder._clone_input = counting
    try:
        guard = weights_shared_while_tracing() if shared else torch.no_grad()
        example = torch.randn(2, 64)
        with guard:
            exported = torch.export.export(model, (example,), strict=True)
        assert builder._clone_input is counting  # the block restored what it found
    finally:
        builder._clone_input = original
    torch.testing.assert_close(exported.module()(example), model(example))  # sharing changes nothing in the result
    return seen[0], weights


def test_strict_export_does_not_clone_the_weights() -> None:
    cloned, weights = _parameter_bytes_cloned(shared=False)
    assert cloned >= weights, f"torch no longer clones parameters while tracing ({cloned} of {weights} B); etsdk._export.tracing may be dropped"
    shared, _ = _parameter_bytes_cloned(shared=True)
    assert shared == 0, f"{shared} B of parameters were still cloned inside weights_shared_while_tracing()"


def test_a_quantized_layers_stored_tensors_are_shared_too() -> None:
    """Parameters, though integer tensors nothing trains: strict export cloned each twice when they were buffers,
    and AOTInductor clones every buffer of a graph it compiles (a second copy of every quantized weight)."""
    import etsdk

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)).eval()
    etsdk.quantize_model(model, "int4:g32:min")
    stored = [t for m in model if isinstance(m, etsdk.QuantizedLinear) for t in (m.qdata, m.scales, m.mins)]
    assert len(stored) == 6
    cache = torch.zeros(3)
    with weights_shared_while_tracing():
        assert all(builder._clone_input(t, None) is t for t in stored)
        assert builder._clone_input(cache, None) is not cache
    assert all(builder._clone_input(t, None) is not t for t in stored)  # outside the block: cloned
    exported = torch.export.export(model, (torch.randn(2, 64),), strict=False)
    names = set(exported.graph_signature.inputs_to_parameters.values())
    assert {f"{i}.{plane}" for i in (0, 1) for plane in ("qdata", "scales", "mins")} <= names
    assert not exported.graph_signature.inputs_to_buffers
