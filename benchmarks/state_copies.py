"""Per-step time of a decode-like method as the cache capacity grows.

The method writes one row of a ``[capacity, 256]`` float cache and reads it back:
the same work per step at every capacity. Two programs of the same model run
in one process:

* ``etsdk``: the cache declared as caller-owned state (contract ``bench_ring``
  v1, registered in-process like any third-party contract), delegated to the
  reference backend; the runtime never sees the cache, the binding updates the
  session's storage in place;
* ``peer``: ExecuTorch's default mutable-buffer handling of the same model
  (``to_edge_transform_and_lower`` + ``to_executorch``, buffer left in the
  program), where the functional ``index_put`` and the copy-back touch the
  whole cache on every step.

Programs are timed interleaved over several rounds; medians are reported. The
last line is JSON with ``capacities``, ``etsdk_us_per_step`` and
``peer_us_per_step``; ``etsdk_flat_ratio`` is largest / smallest of the etsdk line,
``peer_growth_ratio`` the peer's largest-capacity / smallest-capacity time.

``--smoke``: capacities 256 and 512, 20 steps, one round (the same exports,
checks and JSON keys; the figures are too noisy to compare).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import etsdk
import torch

WIDTH = 256


class Ring(torch.nn.Module):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(capacity, WIDTH))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, position, x * 2.0)
        return self.cache.index_select(0, position) + x


def _contract_spec() -> dict[str, Any]:
    return {
        "format": "etsdk.contract",
        "format_version": [1, 0],
        "name": "bench_ring",
        "version": 1,
        "required_features": ["state.caller_owned", "alias.kv_cache_update"],
        "dims": {"S": None, "W": WIDTH},
        "states": [{"name": "cache", "role": "kv_cache_key", "dtype": "float32", "shape": ["S", "W"]}],
        "methods": {
            "decode": {
                "inputs": [
                    {"name": "x", "role": "hidden", "dtype": "float32", "shape": [1, "W"]},
                    {"name": "position", "role": "positions", "dtype": "int64", "shape": [1]},
                    {"name": "cache_in", "role": "kv_cache_key", "dtype": "float32", "shape": ["S", "W"], "state": "cache"},
                ],
                "outputs": [
                    {"name": "cache_out", "role": "kv_cache_key", "dtype": "float32", "shape": ["S", "W"],
                     "alias": {"input": "cache_in", "kind": "kv_cache_update", "ownership": "caller", "state": "cache"}},
                    {"name": "y", "role": "hidden", "dtype": "float32", "shape": [1, "W"]},
                ],
            }
        },
    }


def _register_contract(directory: Path) -> etsdk.Contract:
    path = directory / "bench_ring.json"
    path.write_text(json.dumps(_contract_spec()))
    etsdk.register_contracts([etsdk.ContractSpec(name="bench_ring", version=1, path=path)], "bench-ring")
    return etsdk.Contract.from_bytes(path.read_bytes())


def _export_etsdk(path: Path, capacity: int, spec: etsdk.Contract) -> None:
    model = Ring(capacity)
    example = (torch.randn(1, WIDTH), torch.tensor([0]))
    source = etsdk.MethodSource(model, example, (etsdk.resolve_backend_id("reference"),), state={"cache": "cache"})
    etsdk.lower({"decode": source}, contract=spec.bind(S=capacity)).save(path)


def _export_peer(path: Path, capacity: int) -> None:
    from executorch.exir import to_edge_transform_and_lower

    exported = torch.export.export(Ring(capacity), (torch.randn(1, WIDTH), torch.tensor([0])))
    with path.open("wb") as f:
        to_edge_transform_and_lower(exported).to_executorch().write_to_file(f)


def _time(run: Any, steps: int, capacity: int) -> float:
    x = torch.randn(1, WIDTH)
    positions = [torch.tensor([i % capacity]) for i in range(steps)]
    start = time.perf_counter()
    for position in positions:
        run(x, position)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capacities", default="256,1024,4096,8192")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--smoke", action="store_true", help="capacities 256,512, 20 steps, one round")
    args = parser.parse_args()
    warmup = 50
    if args.smoke:
        args.capacities, args.steps, args.rounds, warmup = "256,512", 20, 1, 5
    torch.set_num_threads(1)
    capacities = [int(c) for c in args.capacities.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        spec = _register_contract(directory)
        runners: dict[tuple[str, int], Any] = {}
        for capacity in capacities:
            _export_etsdk(directory / f"etsdk_{capacity}.pte", capacity, spec)
            _export_peer(directory / f"peer_{capacity}.pte", capacity)
            program = etsdk.load(directory / f"etsdk_{capacity}.pte")
            session = program.new_session()
            method = program.load_method("decode")
            runners[("etsdk", capacity)] = lambda x, p, m=method, s=session: m.execute((x, p), session=s)
            peer = etsdk.load(directory / f"peer_{capacity}.pte").load_method("forward")
            runners[("peer", capacity)] = lambda x, p, m=peer: m.execute((x, p))
            # both compute the same thing, and the etsdk cache is the session's storage
            x = torch.randn(1, WIDTH)
            got = runners[("etsdk", capacity)](x, torch.tensor([3]))[0]
            torch.testing.assert_close(got, runners[("peer", capacity)](x, torch.tensor([3]))[0])
            torch.testing.assert_close(session.state["cache"][3], (x * 2.0)[0])
        samples: dict[tuple[str, int], list[float]] = {key: [] for key in runners}
        for key, run in runners.items():
            _time(run, warmup, key[1])  # warm-up
        for _ in range(args.rounds):
            for key, run in runners.items():
                samples[key].append(_time(run, args.steps, key[1]))
    etsdk_line = [statistics.median(samples[("etsdk", c)]) for c in capacities]
    peer_line = [statistics.median(samples[("peer", c)]) for c in capacities]
    for capacity, e, p in zip(capacities, etsdk_line, peer_line):
        print(f"capacity {capacity:6d} rows ({capacity * WIDTH * 4 / 2**20:6.2f} MiB): etsdk {e:8.2f} us/step   peer {p:9.2f} us/step")
    print(
        json.dumps(
            {
                "capacities": capacities,
                "etsdk_us_per_step": [round(v, 3) for v in etsdk_line],
                "peer_us_per_step": [round(v, 3) for v in peer_line],
                "etsdk_flat_ratio": round(max(etsdk_line) / min(etsdk_line), 3),
                "peer_growth_ratio": round(peer_line[-1] / peer_line[0], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
