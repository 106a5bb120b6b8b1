"""The options a TensorRT partition is exported with, validated once and carried as one compile spec.

``device``             where the engine runs and where caller-owned state must live: ``"cuda"`` (default)
                       or ``"cpu"`` (only an engine whose tensors TensorRT places on the host can use it;
                       real TensorRT engines place I/O on the device, so ``"cpu"`` is for host-located
                       engines such as the test stand-in)
``precision``          ``"fp32"`` (default: TF32 off), ``"tf32"``, ``"fp16"`` or ``"bf16"`` (builder flags of
                       TensorRT 10; TensorRT 11 builds strongly typed networks and refuses the last two)
``build``              when the engine is built: ``"auto"`` (at export when TensorRT is importable and a GPU
                       is present, else on first load), ``"export"`` (at export, or fail) or ``"load"``
                       (always on first load on the target: the GPU that runs it is the one it is built for)
``keep_onnx``          keep the ONNX in the blob beside a built engine (default True), so a program whose
                       engine was built for another TensorRT version or GPU is rebuilt instead of refused
``workspace_mib``      the builder's workspace pool limit (default: TensorRT's)
``optimization_level`` the builder optimisation level, 0 to 5 (default: TensorRT's)
``progress``           show engine-build progress on stderr (default True)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from etsdk import ExportError

from etsdk_tensorrt import BACKEND_ID

#: Compile spec carrying :class:`BuildOptions` as JSON.
OPTIONS_SPEC = "tensorrt.options"

#: ``device`` when none is given (a module constant so a test harness can run the stand-in from the CLI).
DEFAULT_DEVICE = "cuda"
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
BUILD_WHEN = ("auto", "export", "load")


@dataclass(frozen=True, slots=True)
class BuildOptions:
    device: str = "cuda"
    precision: str = "fp32"
    build: str = "auto"
    keep_onnx: bool = True
    workspace_mib: int | None = None
    optimization_level: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.device != "cpu" and self.device != "cuda" and not self.device.startswith("cuda:"):
            problems.append(f"device must be 'cuda' or 'cpu', found {self.device!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, found {self.precision!r}")
        if self.build not in BUILD_WHEN:
            problems.append(f"build must be one of {', '.join(BUILD_WHEN)}, found {self.build!r}")
        if not isinstance(self.keep_onnx, bool):
            problems.append(f"keep_onnx must be a bool, found {self.keep_onnx!r}")
        if self.workspace_mib is not None and (not _is_int(self.workspace_mib) or self.workspace_mib <= 0):
            problems.append(f"workspace_mib must be a positive integer, found {self.workspace_mib!r}")
        if self.optimization_level is not None and (not _is_int(self.optimization_level) or not 0 <= self.optimization_level <= 5):
            problems.append(f"optimization_level must be an integer from 0 to 5, found {self.optimization_level!r}")
        if not isinstance(self.progress, bool):
            problems.append(f"progress must be a bool, found {self.progress!r}")
        if problems:
            raise ExportError(f"backend '{BACKEND_ID}': " + "; ".join(problems))

    @property
    def state_device(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> BuildOptions:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ExportError(
                f"backend '{BACKEND_ID}' has no option(s) {', '.join(unknown)} (options: {', '.join(sorted(known))})"
            )
        given = dict(options)
        given.setdefault("device", DEFAULT_DEVICE)
        return cls(**given)

    @classmethod
    def from_compile_specs(cls, specs: Mapping[str, bytes]) -> BuildOptions:
        raw = specs.get(OPTIONS_SPEC)
        if raw is None:
            return cls()
        return cls.from_options(json.loads(bytes(raw).decode()))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
