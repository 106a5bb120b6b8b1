"""Tracing without the weights: a module's tensors on the meta device, their values given after tracing.

A model built on the meta device (``with torch.device("meta")``, or only its parameters registered there) holds
no weight: each tensor is a name, a dtype, a shape and a stride. :func:`etsdk.lower` traces such a module against
those descriptions and binds the values the caller gives (``lower(weights={name: tensor})``, for example tensors
memory-mapped from a checkpoint) into every traced program before anything reads a weight. The model's
fingerprint, the backends' compilers and the named data then see exactly what they would have seen from a module
holding those values, and nothing model-sized is built to trace it.

Every value is checked against its description before tracing starts (a missing weight or a wrong dtype, shape
or stride costs nothing), under any of the names the module gives that tensor: a weight tied between the
embedding and the output head is one tensor with two names, and the value of either binds both.

Why fake tensors "on the CPU" while tracing, not the meta tensors themselves: meta is a device, so a graph traced
through meta weights and CPU inputs computes its results on meta (``torch.export`` records each node's device) and
a compiler would generate code for that device. A fake tensor describes a CPU tensor without its storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from etsdk._format.dtypes import dtype_name
from etsdk.errors import ExportError

__all__ = ["DescribedWeights", "bind_described", "described_weights", "fake_while_tracing"]


@dataclass(frozen=True, slots=True)
class DescribedWeights:
    """The values of a lowering's meta tensors, checked: every name a module gives one of them -> its value (a
    parameter where the module holds a parameter; one object per tensor, shared by its names and methods)."""

    values: Mapping[str, Any]

    def __bool__(self) -> bool:
        return bool(self.values)


def _described(module: Any) -> dict[int, tuple[Any, list[str]]]:
    """``id(tensor) -> (tensor, names)`` for every parameter and buffer of ``module`` on the meta device."""
    found: dict[int, tuple[Any, list[str]]] = {}
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if tensor is not None and tensor.device.type == "meta":
            found.setdefault(id(tensor), (tensor, []))[1].append(name)
    return found


def _layout(tensor: Any) -> str:
    return f"{dtype_name(tensor.dtype)} {list(tensor.shape)} (stride {list(tensor.stride())})"


def described_weights(modules: Mapping[str, Any], weights: Mapping[str, Any] | None) -> DescribedWeights:
    """Check ``weights`` against the meta tensors of ``modules`` (method -> module), before anything is traced.

    Raises :class:`~etsdk.errors.ExportError` naming the tensor when a module holds meta tensors and ``weights``
    is None, when no name of a tensor is in ``weights``, or when a value is not a CPU tensor of the described
    dtype, shape and stride; also when ``weights`` is given and no module holds a meta tensor (a mistake, not a
    no-op: the values would be ignored)."""
    import torch

    tensors: dict[int, tuple[Any, list[str]]] = {}
    for module in modules.values():
        for key, (tensor, names) in _described(module).items():
            known = tensors.setdefault(key, (tensor, []))[1]
            known.extend(n for n in names if n not in known)
    if not tensors:
        if weights is not None:
            raise ExportError(
                "lower(weights=...) gives the values of tensors on the meta device, but no parameter or buffer of "
                "the methods' modules is on the meta device"
            )
        return DescribedWeights({})
    if weights is None:
        tensor, names = next(iter(tensors.values()))
        raise ExportError(
            f"{len(tensors)} parameter(s) / buffer(s) of the module are on the meta device (e.g. '{names[0]}', "
            f"{_layout(tensor)}): give their values with lower(weights={{name: tensor}})"
        )
    if not isinstance(weights, Mapping):
        raise ExportError(f"lower(weights=...) takes a mapping of tensor name -> tensor, found {type(weights).__name__}")
    values: dict[str, Any] = {}
    for tensor, names in tensors.values():
        given = next((n for n in names if n in weights), None)
        if given is None:
            raise ExportError(
                f"'{names[0]}' ({_layout(tensor)}) is on the meta device and weights= has no value for it"
                + (f" (nor for {', '.join(repr(n) for n in names[1:])}, the same tensor)" if len(names) > 1 else "")
            )
        value = weights[given]
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            found = f"a {value.device.type} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ExportError(f"weights['{given}'] must be a CPU tensor, found {found}")
        if (value.dtype, value.shape, value.stride()) != (tensor.dtype, tensor.shape, tensor.stride()):
            raise ExportError(f"weights['{given}'] is {_layout(value)}; the module describes {_layout(tensor)}")
        if isinstance(tensor, torch.nn.Parameter):
            value = torch.nn.Parameter(value.detach(), requires_grad=False)
        values.update(dict.fromkeys(names, value))
    return DescribedWeights(values)


@contextlib.contextmanager
def fake_while_tracing(module: Any) -> Iterator[None]:
    """Within the block, ``module``'s meta tensors are fake CPU tensors of the same layout (restored after it)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    described = _described(module)
    if not described:
        yield
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes: dict[int, Any] = {}
    for key, (tensor, _) in described.items():
        with mode:
            fake = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
        fakes[key] = torch.nn.Parameter(fake, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else fake
    swapped = _swap(module, fakes)
    try:
        yield
    finally:
        for owner, slot, name, original in swapped:
            getattr(owner, slot)[name] = original


def _swap(module: Any, replacements: Mapping[int, Any]) -> list[tuple[Any, str, str, Any]]:
    """Put ``replacements[id(tensor)]`` in place of each such tensor of ``module``; what to put back."""
    swapped = []
    for owner in module.modules():
        for slot in ("_parameters", "_buffers"):
            table = getattr(owner, slot)
            for name, tensor in list(table.items()):
                if tensor is not None and id(tensor) in replacements:
                    swapped.append((owner, slot, name, tensor))
                    table[name] = replacements[id(tensor)]
    return swapped


def bind_described(exported: Mapping[str, Any], described: DescribedWeights) -> None:
    """Put each traced program's described tensors' values in place (its ``state_dict`` and constants)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    if not described:
        return
    for method, program in exported.items():
        for table in (program.state_dict, program.constants):
            for name, tensor in list(table.items()):
                if not isinstance(tensor, FakeTensor) and not (isinstance(tensor, torch.Tensor) and tensor.is_meta):
                    continue
                if name not in described.values:  # every name of a described tensor was checked before tracing
                    raise ExportError(f"method '{method}': '{name}' was traced without a value and none was bound")
                table[name] = described.values[name]
