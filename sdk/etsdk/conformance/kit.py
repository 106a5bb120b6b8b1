"""The kit's fixtures: exports of its models through the backend under test, made once and shared.

A :class:`Kit` is one backend under test: its spec, the partitioner options to
use, a directory for programs, and memoized exports (AOTInductor-style backends
compile at export, so every behaviour reuses the same few programs). With a
*companion* backend, every export lowers with ``(backend under test, companion)``
in that order: the backend under test claims what it claims first and the
companion computes the rest, so a partial backend is checked on its operators.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import etsdk
from etsdk._plugins.specs import Capability

REFERENCE = "EtsdkReferenceBackend"
PAIR_CONTRACT = Path(__file__).resolve().parent / "data" / "pair.json"
PREFILL = 4  # rows of the toy decoder's prefill


@dataclass(frozen=True)
class Exported:
    """One program the kit exported: where it is, and what the core handed to each backend."""

    path: Path
    delegates: tuple[Any, ...]  # etsdk.testing.CapturedDelegate

    def of(self, backend_id: str) -> list[Any]:
        return [d for d in self.delegates if d.backend_id == backend_id]


@dataclass
class Kit:
    backend_id: str
    options: dict[str, Any]
    workdir: Path
    companion: str | None = None
    _cache: dict[str, Exported] = field(default_factory=dict)

    # ------------------------------------------------------------------ the backend

    @property
    def spec(self) -> etsdk.BackendSpec:
        return etsdk.get_backend(self.backend_id)

    def has(self, capability: Capability) -> bool:
        return capability in self.spec.capabilities

    def unavailable_reason(self) -> str | None:
        from etsdk._plugins.registry import backend_availability

        availability = backend_availability(self.backend_id)
        return None if availability is None or availability.available else availability.reason

    def binding(self) -> Any:
        return self.spec.runtime()

    # ------------------------------------------------------------------ exports

    def with_companion(self, backends: tuple[str, ...]) -> tuple[str, ...]:
        """``backends`` with the companion appended (last: it computes what the others leave), if there is one."""
        if self.companion is None or self.companion in backends:
            return tuple(backends)
        return (*backends, self.companion)

    def _options(self, backends: tuple[str, ...], reference_ops: list[str] | None) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.options and self.backend_id in backends:
            out[self.backend_id] = dict(self.options)
        if reference_ops is not None and REFERENCE in backends:
            out[REFERENCE] = {"ops": reference_ops}
        return out

    def export(self, name: str, build: Callable[[], Any], **lower: Any) -> Exported:
        """Export once per kit; ``build()`` returns the ``methods`` mapping for ``etsdk.lower``."""
        found = self._cache.get(name)
        if found is not None:
            return found
        from etsdk.testing import capture_delegates

        path = self.workdir / f"{name}.pte"
        with capture_delegates() as captured:
            etsdk.lower(build(), **lower).save(path)
        found = Exported(path, tuple(captured))
        self._cache[name] = found
        return found

    def one_method(self, name: str, module: Any, example: tuple[Any, ...], backends: tuple[str, ...], reference_ops: list[str] | None = None) -> Exported:
        backends = self.with_companion(backends)

        def build() -> dict[str, Any]:
            return {"forward": etsdk.MethodSource(module, example, backends, self._options(backends, reference_ops))}

        return self.export(name, build)

    def toy(self, prefill: str, decode: str) -> tuple[Exported, Any]:
        """The core's toy decoder (kv_decoder v1): prefill on one backend, decode on another."""
        from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract

        model = ToyDecoder(seed=5).eval()
        state = model.state_fqns()

        def build() -> dict[str, Any]:
            out = {}
            for method, rows, backend in (("prefill", PREFILL, prefill), ("decode", 1, decode)):
                import torch

                example = (torch.zeros(1, rows, dtype=torch.long), torch.arange(rows))
                backends = self.with_companion((backend,))
                options = self._options(backends, None)
                out[method] = etsdk.MethodSource(model, example, backends, options, state=state)
            return out

        exported = self.export(f"toy-{prefill}-{decode}", build, contract=kv_decoder_contract(model, PREFILL))
        eager = copy.deepcopy(model)
        eager.reset_caches()
        return exported, eager

    def batched(self, slots: int) -> Exported:
        """The toy decoder over kv_decoder v2: prefill and decode on the reference backend, ``decode_batch`` (a
        decode step over ``slots`` sessions) on the backend under test."""
        import torch

        from etsdk.testing.toy_decoder import BatchedToyDecoder, ToyDecoder, kv_decoder_contract

        model = ToyDecoder(seed=5).eval()
        state = model.state_fqns()

        def build() -> dict[str, Any]:
            out = {}
            for method, rows in (("prefill", PREFILL), ("decode", 1)):
                example = (torch.zeros(1, rows, dtype=torch.long), torch.arange(rows))
                out[method] = etsdk.MethodSource(model, example, (REFERENCE,), state=state)
            batch = BatchedToyDecoder(model, slots)
            backends = self.with_companion((self.backend_id,))
            example = (torch.zeros(slots, 1, dtype=torch.long), torch.zeros(slots, dtype=torch.long))
            out["decode_batch"] = etsdk.MethodSource(batch, example, backends, self._options(backends, None), state=batch.state_slots())
            return out

        return self.export(f"batched-{slots}", build, contract=kv_decoder_contract(model, PREFILL, slots=slots))

    def pair(self) -> tuple[Exported, Any]:
        """A cache update beside two same-shaped user outputs (contract etsdk_kit_pair v1)."""
        import torch

        from etsdk.conformance.models import CachePair, D, S

        etsdk.register_contracts(
            [etsdk.ContractSpec(name="etsdk_kit_pair", version=1, path=PAIR_CONTRACT)], "etsdk-conformance-kit"
        )
        model = CachePair().eval()
        contract = etsdk.Contract.from_bytes(PAIR_CONTRACT.read_bytes()).bind(S=S, D=D)

        backends = self.with_companion((self.backend_id,))

        def build() -> dict[str, Any]:
            example = (torch.randn(1, D), torch.tensor([0]))
            return {"step": etsdk.MethodSource(model, example, backends, self._options(backends, None), state={"k": "k"})}

        exported = self.export("pair", build, contract=contract)
        eager = copy.deepcopy(model)
        eager.k.zero_()
        return exported, eager
