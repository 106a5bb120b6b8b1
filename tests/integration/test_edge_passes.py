"""Backend-contributed edge transform passes reach the lowering through the core's hook."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import etsdk
import torch
from etsdk.reference_backend.runtime import ReferenceBinding

from tests.backends import make_backend_plugin

CALLS: list[str] = []


def relu_to_abs(graph_module: torch.fx.GraphModule) -> None:
    """A visible rewrite: every relu becomes abs."""
    from executorch.exir.dialects._ops import ops as exir_ops

    CALLS.append("relu_to_abs")
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target == exir_ops.edge.aten.relu.default:
            node.target = exir_ops.edge.aten.abs.default
    graph_module.recompile()


def _pass_plugin(backend_id: str) -> types.ModuleType:
    module = types.ModuleType("edge_pass_plugin")
    module.ETSDK_PLUGIN_API = ">=2,<3"  # type: ignore[attr-defined]

    @etsdk.hookimpl
    def etsdk_edge_transform_passes(backend_id: str) -> list[Any] | None:
        return [relu_to_abs] if backend_id == wanted else None

    wanted = backend_id
    module.etsdk_edge_transform_passes = etsdk_edge_transform_passes  # type: ignore[attr-defined]
    return module


class Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2


def test_pass_runs_only_for_its_backend(tmp_path: Path) -> None:
    etsdk.register_plugin(make_backend_plugin("EtsdkPassTargetBackend", ReferenceBinding), "pass-target")
    etsdk.register_plugin(_pass_plugin("EtsdkPassTargetBackend"), "pass-provider")
    x = torch.tensor([-1.0, 2.0, -3.0])
    CALLS.clear()
    etsdk.lower(module=Relu(), example_inputs=(x,), backend="EtsdkPassTargetBackend").save(tmp_path / "a.pte")
    assert CALLS == ["relu_to_abs"]
    torch.testing.assert_close(etsdk.load(tmp_path / "a.pte").run("forward", x)[0], x.abs() * 2)
    CALLS.clear()
    etsdk.lower(module=Relu(), example_inputs=(x,), backend="EtsdkReferenceBackend").save(tmp_path / "b.pte")
    assert CALLS == []
    torch.testing.assert_close(etsdk.load(tmp_path / "b.pte").run("forward", x)[0], torch.relu(x) * 2)


def test_a_plugin_that_lost_its_claim_on_a_backend_contributes_no_passes_for_it(tmp_path: Path) -> None:
    """A plugin claiming the core's reference backend has that record refused, and its passes for it ignored."""
    from etsdk.testing import PluginSite

    site = PluginSite(tmp_path / "site")
    site.add(
        "shadow-dist",
        """
        from etsdk import hookimpl, BackendSpec
        ETSDK_PLUGIN_API = ">=2,<3"
        CALLED = []

        def _factory(*a, **k):
            raise RuntimeError("never used: the record is refused")

        def mark(graph_module):
            raise AssertionError("a refused plugin's pass ran")

        @hookimpl
        def etsdk_register_backends():
            return [BackendSpec(id="EtsdkReferenceBackend", version="9", partitioner=_factory, preprocess=_factory,
                                runtime=_factory),
                    BackendSpec(id="ShadowOwnBackend", version="9", partitioner=_factory, preprocess=_factory,
                                runtime=_factory)]

        @hookimpl
        def etsdk_edge_transform_passes(backend_id):
            return [mark]
        """,
        plugin="shadow",
    )
    result = site.run_python(
        f"""
        import torch, etsdk
        x = torch.tensor([-1.0, 2.0])
        m = torch.nn.ReLU()
        etsdk.lower(module=m, example_inputs=(x,), backend="EtsdkReferenceBackend").save({str(tmp_path / "r.pte")!r})
        print("OUT", etsdk.load({str(tmp_path / "r.pte")!r}).run("forward", x)[0].tolist())
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OUT [0.0, 2.0]" in result.stdout
