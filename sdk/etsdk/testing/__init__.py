"""Helpers for testing etsdk and etsdk plugins (ours and third parties').

* :class:`PluginSite`: real plugin distributions on a temporary path, and etsdk
  run in a subprocess that discovers them through real entry points.
* :class:`ToyDecoder` / :func:`kv_decoder_methods`: a small attention decoder
  with per-layer KV caches that follows the core's ``kv_decoder`` v1 contract,
  for testing stateful backends against eager PyTorch; :class:`BatchedToyDecoder`
  its decode step over several sessions in one call (``kv_decoder`` v2).
* :func:`capture_delegates` / :func:`transform_payloads` /
  :func:`with_required_feature`: see and change what an export hands to backends.
* :func:`memory_cgroup`: run a command under a memory limit (needs root).
* :func:`resident_bytes`: how much of a mapping (a memory-mapped file's) the process holds (Linux).
"""

from etsdk.testing.cgroups import MemoryCgroup, memory_cgroup
from etsdk.testing.delegates import CapturedDelegate, capture_delegates, transform_payloads, with_required_feature
from etsdk.testing.memory import resident_bytes
from etsdk.testing.plugins import PluginSite

__all__ = [
    "BatchedToyDecoder",
    "CapturedDelegate",
    "MemoryCgroup",
    "NamedDataStub",
    "PluginSite",
    "ToyDecoder",
    "capture_delegates",
    "kv_decoder_contract",
    "kv_decoder_methods",
    "memory_cgroup",
    "resident_bytes",
    "transform_payloads",
    "with_required_feature",
]


class NamedDataStub:
    """Named data for calling a runtime binding's ``init`` directly (tests, benchmarks): key -> buffer."""

    def __init__(self, entries: dict[str, memoryview]) -> None:
        self.entries = entries

    def get(self, key: str) -> memoryview:
        """As :meth:`etsdk.backend.NamedData.get`: the buffer, or the same :class:`etsdk.ProgramError` when missing."""
        if key not in self.entries:
            from etsdk.errors import ProgramError

            raise ProgramError(f"named data '{key}' is missing")
        return self.entries[key]

    def keys(self) -> list[str]:
        """The keys given."""
        return list(self.entries)

    def get_tensor(self, key: str, dtype: object, shape: tuple[int, ...]) -> object:
        """As :meth:`etsdk.backend.NamedData.get_tensor`: a read-only tensor over the buffer, its size checked."""
        from etsdk._runtime.bridge import tensor_over

        return tensor_over(key, memoryview(self.get(key)), dtype, shape)


def __getattr__(name: str):  # torch-dependent helpers load lazily
    if name in {"BatchedToyDecoder", "ToyDecoder", "kv_decoder_methods", "kv_decoder_contract"}:
        from etsdk.testing import toy_decoder

        return getattr(toy_decoder, name)
    raise AttributeError(name)
