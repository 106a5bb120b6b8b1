"""``etsdk inspect``: what a program holds, read from the file without running it.

For each method, its delegates in engine order (every backend id, etsdk's or the runtime's own), and for each
etsdk delegate what its program-record entry says: the operators it claimed, its engine inputs and outputs in
binding order, the state it binds (placeholder, module FQN, state identity, written or only read), its
payload's format and required features and SHA-256. Then the contract with its metadata, the model
fingerprint, and every named-data entry with its size and file. Backends need not be installed: this is how
to see which plugin a program needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DelegateReport", "MethodReport", "NamedDataReport", "ProgramReport", "inspect_program"]


@dataclass(frozen=True, slots=True)
class DelegateReport:
    backend: str
    provider: str  # "etsdk plugin <name>", "ExecuTorch runtime", or "not installed"
    signature: Any = None  # etsdk._state.signature.DelegateSignature for etsdk delegates

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "provider": self.provider}
        if self.signature is not None:
            out.update(self.signature.to_json())
        return out


@dataclass(frozen=True, slots=True)
class MethodReport:
    name: str
    delegates: tuple[DelegateReport, ...]


@dataclass(frozen=True, slots=True)
class NamedDataReport:
    key: str
    size: int
    file: str


@dataclass(frozen=True, slots=True)
class ProgramReport:
    path: str
    size: int
    methods: tuple[MethodReport, ...]
    record: Any = None  # etsdk._state.signature.ProgramRecord, or None for a program etsdk did not write
    named_data: tuple[NamedDataReport, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        record = self.record
        return {
            "program": self.path,
            "size": self.size,
            "producer": record.producer if record is not None else None,
            "contract": record.contract.to_json() if record is not None and record.contract is not None else None,
            "model": _model_json(record),
            "methods": {m.name: [d.to_json() for d in m.delegates] for m in self.methods},
            "named_data": [{"key": e.key, "size": e.size, "file": e.file} for e in self.named_data],
        }

    def render(self) -> str:
        lines = [f"{self.path} ({self.size} bytes)"]
        record = self.record
        if record is None:
            lines.append("  no etsdk program record (not written by etsdk.lower)")
        else:
            lines.append(f"  producer: {record.producer or '?'}")
            if record.contract is not None:
                c = record.contract
                dims = ", ".join(f"{k}={v}" for k, v in c.dims.items())
                lines.append(f"  contract: {c.name} v{c.version} ({dims}); {len(c.states)} state(s)")
                for key, value in sorted(dict(c.metadata).items()):
                    lines.append(f"    metadata {key}: {value}")
            if record.model is not None:
                lines.append(f"  model: weights {record.model.weights[:16]}..., states {record.model.states[:16]}...")
        for method in self.methods:
            lines.append(f"  method {method.name}: {len(method.delegates)} delegate(s)")
            for index, d in enumerate(method.delegates):
                lines.append(f"    [{index}] {d.backend} ({d.provider})")
                s = d.signature
                if s is None:
                    continue
                ops = ", ".join(f"{name} x{count}" for name, count in s.operators)
                lines.append(f"        operators: {ops or '-'}")
                lines.append(f"        inputs:  {', '.join(a.describe() for a in s.inputs) or '-'}")
                lines.append(f"        outputs: {', '.join(a.describe() for a in s.outputs) or '-'}")
                for b in s.states:
                    what = "reads and writes" if b.written else "reads"
                    lines.append(f"        state {b.state}: {what} {b.dtype} {list(b.shape)} (buffer {b.fqn})")
                features = "opaque payload" if s.payload_features is None else f"etsdk blob requiring {', '.join(s.payload_features) or 'nothing'}"
                lines.append(f"        payload: {features}; sha256 {s.payload_sha256[:16]}...")
        if self.named_data:
            total = sum(e.size for e in self.named_data)
            lines.append(f"  named data: {len(self.named_data)} entr{'y' if len(self.named_data) == 1 else 'ies'}, {total} bytes")
            for e in self.named_data:
                lines.append(f"    {e.key}  {e.size} bytes  ({e.file})")
        return "\n".join(lines)


def _model_json(record: Any) -> Any:
    return record.model.to_json() if record is not None and record.model is not None else None


def _provider(backend: str, builtin: set[str]) -> str:
    from etsdk._plugins.registry import list_plugins

    for plugin in list_plugins():
        if backend in plugin.backends:
            return f"etsdk plugin {plugin.name} ({plugin.distribution} {plugin.version}, {plugin.status.value})"
    return "ExecuTorch runtime" if backend in builtin else "not installed: no plugin provides it"


def inspect_program(path: str | Path, data: str | Path | None = None) -> ProgramReport:
    """Read ``path`` (and its ``.ptd``) without loading any backend; raises ProgramError for a bad file.

    The files go through the same checks ``etsdk.load`` makes before the runtime reads them.
    """
    from etsdk._runtime.bridge import runtime_backend_names
    from etsdk._runtime.program import open_checked

    checked = open_checked(path, data, check_contract=False)
    checked.files.close()
    record = checked.record
    builtin = set(runtime_backend_names())
    methods = []
    for method, backends in checked.backends.items():
        ours = list(record.methods.get(method, ())) if record is not None else []
        delegates = []
        for backend in backends:
            signature = None
            if ours and ours[0].backend == backend:
                signature = ours.pop(0).signature
            delegates.append(DelegateReport(backend, _provider(backend, builtin), signature))
        methods.append(MethodReport(method, tuple(delegates)))
    named = [NamedDataReport(e.key, e.size, checked.path.name) for e in checked.layout.entries]
    if checked.data_layout is not None and checked.data_path is not None:
        named += [NamedDataReport(e.key, e.size, checked.data_path.name) for e in checked.data_layout.entries]
    return ProgramReport(str(checked.path), checked.layout.size, tuple(methods), record, tuple(named))
