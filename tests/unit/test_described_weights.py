"""Tracing without the weights (``etsdk.lower(weights=...)``, etsdk._export.described): a module built on the
meta device lowers to the same program, byte for byte, as the same module holding its values; every value is
checked against its description before tracing; the module is left as it was."""

from __future__ import annotations

from pathlib import Path

import etsdk
import pytest
import torch
from etsdk.errors import ExportError


class Tied(torch.nn.Module):
    """An embedding and an output head sharing one weight, a bias and a buffer computed at construction."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(12, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 12, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 8), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.embed(ids)) * self.scale)


IDS = torch.tensor([[3, 1, 4, 1, 5]])


def _models() -> tuple[Tied, Tied]:
    torch.manual_seed(0)
    real = Tied().eval()
    with torch.device("meta"):
        described = Tied().eval()
    described.scale = real.scale.clone()  # computed, not stored: built for real (as a model's rotary table is)
    return real, described


def _values(real: torch.nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in real.state_dict().items() if k not in skip}


def _lower(module: torch.nn.Module, path: Path, weights: dict[str, torch.Tensor] | None = None) -> bytes:
    lowered = etsdk.lower(module=module, example_inputs=(IDS,), backend="reference", weights=weights)
    lowered.save(path)
    return path.read_bytes()


def test_meta_module_lowers_to_the_same_program(tmp_path: Path) -> None:
    real, described = _models()
    expected = _lower(real, tmp_path / "real.pte")
    # the tied weight is given under the head's name only: its other name (embed.weight) takes the same value
    found = _lower(described, tmp_path / "meta.pte", _values(real, skip=("embed.weight",)))
    assert found == expected
    program = etsdk.load(tmp_path / "meta.pte")
    torch.testing.assert_close(program.run("forward", IDS)[0], real(IDS), rtol=1e-5, atol=1e-5)  # (identical programs: asserted above)
    # the module is left as it was: still a description, nothing fake left in it
    assert {t.device.type for t in described.parameters()} == {"meta"}
    assert all(type(t) in (torch.nn.Parameter, torch.Tensor) for t in [*described.parameters(), *described.buffers()])


def _refusal(weights: dict[str, torch.Tensor] | None, module: torch.nn.Module | None = None) -> str:
    real, described = _models()
    with pytest.raises(ExportError) as caught:
        etsdk.lower(module=module or described, example_inputs=(IDS,), backend="reference", weights=weights)
    return str(caught.value)


def test_values_are_checked_before_tracing() -> None:
    real, _ = _models()
    values = _values(real)
    assert "on the meta device (e.g. 'embed.weight', float32 [12, 8]" in _refusal(None)
    assert "give their values with lower(weights=" in _refusal(None)
    missing = {k: v for k, v in values.items() if k not in ("embed.weight", "head.weight")}
    message = _refusal(missing)
    assert "'embed.weight' (float32 [12, 8] (stride [8, 1])) is on the meta device and weights= has no value" in message
    assert "nor for 'head.weight', the same tensor" in message
    assert "weights['mix.weight'] is float64 [8, 8]" in _refusal({**values, "mix.weight": values["mix.weight"].double()})
    transposed = values["mix.weight"].t().contiguous().t()  # same shape, column-major
    assert "(stride [1, 8]); the module describes float32 [8, 8] (stride [8, 1])" in _refusal({**values, "mix.weight": transposed})
    assert "weights['mix.bias'] must be a CPU tensor, found list" in _refusal({**values, "mix.bias": [0.0] * 8})  # type: ignore[dict-item]
    assert "no parameter or buffer of the methods' modules is on the meta device" in _refusal(values, module=real)
    assert "takes a mapping of tensor name -> tensor, found list" in _refusal(list(values.values()))  # type: ignore[arg-type]


def test_module_restored_when_tracing_fails() -> None:
    real, described = _models()
    with pytest.raises(ExportError, match="torch.export of method 'forward' failed"):
        etsdk.lower(module=described, example_inputs=(torch.zeros(1, 5),), backend="reference", weights=_values(real))
    assert {t.device.type for t in described.parameters()} == {"meta"}
    assert described.head.weight is described.embed.weight  # still tied: the same object put back in both places
