"""Damaged payloads handed straight to a backend's runtime binding, in a process that may die.

The core refuses a payload whose bytes changed after export (its SHA-256 is
recorded), so this checks the backend's *own* parsing: the kit rebuilds each
damaged payload and calls ``binding.init`` and one ``execute`` directly. A
Python exception of any kind is fine (through the bridge it arrives as an
etsdk error); a process killed by a signal is a crash.

``python -m etsdk.conformance.mutations CASES.pickle START`` runs cases from
``START`` and prints ``START i`` / ``DONE i outcome`` lines; :func:`run_cases`
restarts after a crash so every case runs.
"""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    kind: str  # "flip" | "truncate"
    offset: int
    value: int = 0


@dataclass(frozen=True)
class Outcome:
    index: int
    case: Case
    result: str  # "ran", "refused <Type>", "raised <Type>", "crash (signal N)", "hung"


def make_cases(size: int, seed: int = 0, flips: int = 32, truncations: int = 8) -> list[Case]:
    """Seeded byte flips (a quarter of them in the first 256 bytes, where headers live) and truncations."""
    rng = random.Random(seed)
    cases = [Case("flip", rng.randrange(min(256, size)), rng.randrange(1, 256)) for _ in range(flips // 4)]
    cases += [Case("flip", rng.randrange(size), rng.randrange(1, 256)) for _ in range(flips - flips // 4)]
    cases += [Case("truncate", rng.randrange(size)) for _ in range(truncations)]
    return cases


def apply(payload: bytes, case: Case) -> bytes:
    if case.kind == "truncate":
        return payload[: case.offset]
    data = bytearray(payload)
    data[case.offset] ^= case.value
    return bytes(data)


def run_cases(job: dict[str, Any], workdir: Path, timeout_s: float = 300.0) -> list[Outcome]:
    """Run every case of ``job`` in subprocesses, restarting after a crash; one outcome per case."""
    cases: Sequence[Case] = job["cases"]
    path = workdir / "mutation-job.pickle"
    path.write_bytes(pickle.dumps(job))
    outcomes: dict[int, str] = {}
    start = 0
    while start < len(cases):
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "etsdk.conformance.mutations", str(path), str(start)],
                capture_output=True, text=True, timeout=timeout_s,
            )
            stdout, code = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            code = None
        last_started = start
        for line in stdout.splitlines():
            parts = line.split(" ", 2)
            if parts[0] == "START":
                last_started = int(parts[1])
            elif parts[0] == "DONE":
                outcomes[int(parts[1])] = parts[2] if len(parts) > 2 else ""
        if code == 0 and all(i in outcomes for i in range(start, len(cases))):
            break
        if last_started not in outcomes:
            outcomes[last_started] = "hung" if code is None else f"crash (exit {code})"
        start = last_started + 1
    return [Outcome(i, cases[i], outcomes.get(i, "not run")) for i in range(len(cases))]


def _worker(path: str, start: int) -> int:
    import torch

    import etsdk
    from etsdk._runtime.bridge import InitContext
    from etsdk._state.signature import DelegateSignature
    from etsdk.testing import NamedDataStub

    job = pickle.loads(Path(path).read_bytes())
    signature = DelegateSignature.from_json(job["signature"], "kit")
    binding = etsdk.get_backend(job["backend_id"]).runtime()
    named = NamedDataStub({k: memoryview(v) for k, v in job["named_data"].items()})
    generator = torch.Generator().manual_seed(0)

    def tensor(dtype: str, shape: tuple[int, ...]) -> Any:
        kind = getattr(torch, dtype)
        if kind.is_floating_point:
            return torch.randn(shape, generator=generator).to(kind)
        return torch.zeros(shape, dtype=kind)

    for index in range(start, len(job["cases"])):
        case = job["cases"][index]
        print(f"START {index}", flush=True)
        payload = apply(job["payload"], case)
        try:
            context = InitContext(
                job["backend_id"], job["method"], memoryview(payload), job["compile_specs"], named, signature  # type: ignore[arg-type]
            )
            handle = binding.init(context)
            args = tuple(tensor(a.dtype, a.shape) for a in (*signature.inputs, *signature.outputs))
            state = tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in signature.states)
            handle.execute(args, state)
            destroy = getattr(handle, "destroy", None)
            if callable(destroy):
                destroy()
            outcome = "ran"
        except etsdk.EtsdkError as exc:
            outcome = f"refused {type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - any Python exception is an orderly refusal here
            outcome = f"raised {type(exc).__name__}"
        print(f"DONE {index} {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], int(sys.argv[2])))
