"""``etsdk inspect``: what a program holds, read from the file without running it.

For each method, its delegates in engine order (every backend id, etsdk's or the runtime's own), and for each
etsdk delegate what its program-record entry says: the operators it claimed, its engine inputs and outputs in
binding order, the state it binds (placeholder, module FQN, state identity, written or only read), its
payload's format and required features and SHA-256, and what the backend's plugin says about the payload
(``BackendSpec.describe_payload``, when the plugin is installed and declares it: the device or CPU its code was
compiled for). Then the contract with its metadata, the model fingerprint, and every named-data entry with its
size and file. Backends need not be installed: this is how to see which plugin a program needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etsdk._format.content_hash import content_digest

__all__ = ["DelegateReport", "MethodReport", "NamedDataReport", "ProgramReport", "inspect_program"]


@dataclass(frozen=True, slots=True)
class DelegateReport:
    backend: str
    provider: str  # "etsdk plugin <name>", "ExecuTorch runtime", or "not installed"
    signature: Any = None  # etsdk._state.signature.DelegateSignature for etsdk delegates
    details: tuple[str, ...] = ()  # the backend's lines about its payload (BackendSpec.describe_payload)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "provider": self.provider}
        if self.signature is not None:
            out.update(self.signature.to_json())
        if self.details:
            out["details"] = list(self.details)
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
        """The text of ``etsdk inspect``: the contract and its sizes first, then each method's delegates, then the
        named data; repeated per-layer lines folded into ranges (``k0..k29``). :meth:`to_json` keeps every detail."""
        lines = [f"{self.path} ({self.size} bytes)"]
        record = self.record
        if record is None:
            lines.append("  no etsdk program record (not written by etsdk.lower)")
        else:
            if record.contract is not None:
                lines += _contract_lines(record.contract)
            lines.append(f"  producer: {record.producer or '?'}")
            if record.model is not None:
                lines.append(f"  model: weights {record.model.weights[:16]}..., states {record.model.states[:16]}...")
        seen: dict[tuple[Any, ...], str] = {}  # state bindings already shown -> where
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
                states = tuple(s.states)
                if len(states) > 1 and states in seen:
                    lines.append(f"        state: the same {len(states)} bindings as {seen[states]}")
                else:
                    lines += [f"        {line}" for line in _binding_lines(states)]
                    seen.setdefault(states, f"method {method.name} [{index}]")
                if s.weights:
                    lines += [f"        {line}" for line in _weight_lines(s.weights)]
                features = "opaque payload" if s.payload_features is None else f"etsdk blob requiring {', '.join(s.payload_features) or 'nothing'}"
                lines.append(f"        payload: {features}; sha256 {s.payload_sha256[:16]}...")
                lines += [f"        {line}" for line in d.details]
        if self.named_data:
            total = sum(e.size for e in self.named_data)
            lines.append(f"  named data: {len(self.named_data)} entr{'y' if len(self.named_data) == 1 else 'ies'}, {total} bytes")
            lines += [f"    {line}" for line in _named_data_lines(self.named_data)]
        return "\n".join(lines)


#: other keys listed one by one per file before the rest are counted (``--json`` lists them all)
_LISTED_KEYS = 12
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _folded(items: Sequence[tuple[str, Hashable]]) -> list[list[int]]:
    """Indexes of ``(name, attributes)`` folded into runs: names ``<prefix><n>``, ``<prefix><n+1>``, ... with equal
    attributes, in order of their first member (members of a run need not be adjacent in ``items``)."""
    runs: list[list[int]] = []
    open_runs: dict[tuple[str, Hashable], tuple[list[int], int]] = {}  # (prefix, attributes) -> (run, last number)
    for index, (name, attributes) in enumerate(items):
        found = _NUMBERED.match(name)
        if found is None:
            runs.append([index])
            continue
        prefix, number = found.group(1), int(found.group(2))
        key = (prefix, attributes)
        current = open_runs.get(key)
        if current is not None and current[1] + 1 == number and found.group(2) == str(number):
            current[0].append(index)
            open_runs[key] = (current[0], number)
        else:
            run = [index]
            runs.append(run)
            open_runs[key] = (run, number)
    return runs


def _span(first: str, last: str) -> str:
    return first if first == last else f"{first}..{last}"


def _fqn_pattern(fqn: str, name: str) -> tuple[str, str] | None:
    """``fqn`` split around the last number in it that equals ``name``'s number (``k_cache_3`` for ``k3``)."""
    found = _NUMBERED.match(name)
    if found is None:
        return None
    at = [m for m in re.finditer(r"\d+", fqn) if m.group() == found.group(2)]
    return (fqn[: at[-1].start()], fqn[at[-1].end() :]) if at else None


def _binding_lines(states: Sequence[Any]) -> list[str]:
    """One line per state binding, consecutive layers with the same dtype, shape, access and buffer name folded."""
    items = []
    for b in states:
        pattern = _fqn_pattern(b.fqn, b.state)
        items.append((b.state, (b.dtype, tuple(b.shape), b.written, pattern if pattern is not None else b.fqn)))
    lines = []
    for run in _folded(items):
        first, last = states[run[0]], states[run[-1]]
        what = "reads and writes" if first.written else "reads"
        buffers = f"buffers {_span(first.fqn, last.fqn)}" if len(run) > 1 else f"buffer {first.fqn}"
        lines.append(f"state {_span(first.state, last.state)}: {what} {first.dtype} {list(first.shape)} ({buffers})")
    return lines


_LAYER = re.compile(r"(?<=\.)(\d+)(?=\.)")


def _weight_lines(weights: Sequence[Any]) -> list[str]:
    """The quantized weights a delegate reads: a count per format, then one line per weight with the layers of
    the same name, format, shape and use folded (``model.layers.{0..29}.mlp.up_proj: int4:g32 [1536, 576]``)."""
    counts: dict[str, int] = {}
    for w in weights:
        counts[w.format] = counts.get(w.format, 0) + 1
    lines = [f"weights: {len(weights)} quantized ({', '.join(f'{f} x {n}' for f, n in sorted(counts.items()))})"]
    groups: dict[tuple[Any, ...], list[int]] = {}
    order: list[tuple[Any, ...]] = []
    for w in weights:
        found = _LAYER.search(w.name)
        pattern = _LAYER.sub("{}", w.name, count=1) if found else w.name
        key = (pattern, w.format, tuple(w.shape), w.use)
        if key not in groups:
            groups[key] = []
            order.append(key)
        if found:
            groups[key].append(int(found.group(1)))
    for key in order:
        pattern, fmt, shape, use = key
        layers = sorted(groups[key])
        if layers:
            consecutive = layers == list(range(layers[0], layers[-1] + 1))
            span = f"{{{layers[0]}..{layers[-1]}}}" if consecutive and len(layers) > 1 else "{" + ",".join(map(str, layers)) + "}"
            name = pattern.replace("{}", span if len(layers) > 1 else str(layers[0]), 1)
        else:
            name = pattern
        lines.append(f"  {name}: {fmt} {list(shape)} {use}")
    return lines


def _contract_lines(contract: Any) -> list[str]:
    """The contract, its sizes, its state folded into ranges, and its metadata as aligned ``key: value`` lines."""
    lines = [f"  contract: {contract.name} v{contract.version}; {len(contract.states)} state(s)"]
    if contract.dims:
        lines.append(f"    sizes: {', '.join(f'{k}={v}' for k, v in contract.dims.items())}")
    lines += [f"    method {m.name}: over {m.slots} sessions, one per slot" for m in contract.methods if m.slots != 1]
    states = contract.states
    items = [(st.name, (st.dtype, tuple(st.shape), st.role, st.initial, st.device, st.ownership)) for st in states]
    for run in _folded(items):
        first, last = states[run[0]], states[run[-1]]
        extra = "".join(
            (f", initial {first.initial:g}" if first.initial else "", f", on {first.device}" if first.device != "cpu" else "")
        )
        role = getattr(first.role, "value", first.role)
        lines.append(f"    state {_span(first.name, last.name)}: {first.dtype} {list(first.shape)} ({role}{extra})")
    metadata = _flat_metadata(contract.metadata)
    if metadata:
        width = max(len(key) for key, _ in metadata) + 1
        lines.append("    metadata:")
        lines += [f"      {key + ':':<{width}} {value}" for key, value in metadata]
    return lines


def _flat_metadata(metadata: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested mappings as dotted keys (sorted); strings as they are, every other value as JSON."""
    out: list[tuple[str, str]] = []
    for key in sorted(metadata, key=str):
        value = metadata[key]
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += _flat_metadata(value, f"{name}.")
        else:
            out.append((name, value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)))
    return out


def _named_data_lines(entries: Sequence[NamedDataReport]) -> list[str]:
    """Content-addressed entries counted per namespace and file (one entry: its key); other keys one by one."""
    groups: dict[tuple[str, str], list[NamedDataReport]] = {}
    others: dict[str, list[NamedDataReport]] = {}
    for e in entries:
        digest = content_digest(e.key)
        if digest is None:
            others.setdefault(e.file, []).append(e)
        else:
            groups.setdefault((e.key[: -len(digest)], e.file), []).append(e)
    lines = []
    for (namespace, file), members in groups.items():
        if len(members) == 1:
            lines.append(f"{members[0].key}  {members[0].size} bytes  ({file})")
        else:
            size = sum(e.size for e in members)
            lines.append(f"{namespace}<sha256>  {len(members)} entries, {size} bytes  ({file})")
    for file, members in others.items():
        lines += [f"{e.key}  {e.size} bytes  ({file})" for e in members[:_LISTED_KEYS]]
        rest = members[_LISTED_KEYS:]
        if rest:
            lines.append(f"... {len(rest)} more entries, {sum(e.size for e in rest)} bytes  ({file}; --json lists every entry)")
    return lines


def _model_json(record: Any) -> Any:
    return record.model.to_json() if record is not None and record.model is not None else None


def _provider(backend: str, builtin: set[str]) -> str:
    from etsdk._plugins.registry import list_plugins

    for plugin in list_plugins():
        if backend in plugin.backends:
            return f"etsdk plugin {plugin.name} ({plugin.distribution} {plugin.version}, {plugin.status.value})"
    return "ExecuTorch runtime" if backend in builtin else "not installed: no plugin provides it"


#: the most payload bytes ``etsdk inspect`` reads to hand one delegate's payload to its plugin's describer
_MAX_DESCRIBED_PAYLOAD = 1 << 31


def _payload_details(backend: str, signature: Any, place: Any, fd: int) -> tuple[str, ...]:
    """The lines the backend's plugin gives for the delegate's payload (``BackendSpec.describe_payload``), read
    from the pinned file, taken out of the core's envelope and checked against the record's uid and SHA-256 first;
    none when the plugin is not installed or declares no describer. A describer that raises is shown as one line."""
    from etsdk._format.envelope import unwrap_blob
    from etsdk._plugins.registry import get_backend
    from etsdk.errors import EtsdkError

    try:
        describe = get_backend(backend).describe_payload
    except EtsdkError:
        return ()
    if describe is None or place is None or place.backend != backend:
        return ()
    if place.size > _MAX_DESCRIBED_PAYLOAD:
        return (f"payload not described: {place.size} bytes is more than inspect reads",)
    data = bytearray()
    while len(data) < place.size:
        chunk = os.pread(fd, min(place.size - len(data), 1 << 24), place.offset + len(data))
        if not chunk:
            return ("payload not described: the file ends inside it",)
        data += chunk
    try:
        uid, payload = unwrap_blob(bytes(data), f"method '{place.method}', delegate {place.index} ({backend})")
    except EtsdkError as exc:
        return (f"payload not described: {' '.join(str(exc).split())}",)
    if uid != signature.uid or hashlib.sha256(payload).hexdigest() != signature.payload_sha256:
        return ("payload not described: it differs from the program record's (damaged, or another delegate's)",)
    try:
        lines = describe(payload)
        return tuple(str(line) for line in lines)
    except Exception as exc:  # noqa: BLE001 - a plugin's describer never stops inspect
        return (f"payload not described: {type(exc).__name__}: {' '.join(str(exc).split())}",)


def inspect_program(path: str | Path, data: str | Path | None = None) -> ProgramReport:
    """Read ``path`` (and its ``.ptd``) without loading any backend; raises ProgramError for a bad file.

    The files go through the same checks ``etsdk.load`` makes before the runtime reads them. An installed
    plugin's ``describe_payload`` reads its delegates' payloads (hash-checked first); no backend code runs.
    """
    from etsdk._runtime.bridge import runtime_backend_names
    from etsdk._runtime.program import open_checked

    checked = open_checked(path, data, check_contract=False)
    try:
        record = checked.record
        builtin = set(runtime_backend_names())
        places = {(p.method, p.index): p for p in checked.layout.delegates}
        methods = []
        for method, backends in checked.backends.items():
            ours = list(record.methods.get(method, ())) if record is not None else []
            delegates = []
            for index, backend in enumerate(backends):
                signature = None
                details: tuple[str, ...] = ()
                if ours and ours[0].backend == backend:
                    signature = ours.pop(0).signature
                    details = _payload_details(backend, signature, places.get((method, index)), checked.files.program.fd)
                delegates.append(DelegateReport(backend, _provider(backend, builtin), signature, details))
            methods.append(MethodReport(method, tuple(delegates)))
    finally:
        checked.files.close()
    named = [NamedDataReport(e.key, e.size, checked.path.name) for e in checked.layout.entries]
    if checked.data_layout is not None and checked.data_path is not None:
        named += [NamedDataReport(e.key, e.size, checked.data_path.name) for e in checked.data_layout.entries]
    return ProgramReport(str(checked.path), checked.layout.size, tuple(methods), record, tuple(named))
