"""One decode step of a small Llama-style decoder: etsdk vs calling the same compiled library directly.

The decoder (transformers config, random weights, static cache, grouped-query
attention) is exported once through etsdk-aoti on CPU. Two ways to run one
decode step, interleaved over several rounds (medians reported):

* ``etsdk``: ``program.run("decode", ids, position, session=session)``: the
  ExecuTorch runtime, the bridge, the etsdk-aoti binding (state already bound),
  the container's ``Run``, the logits copied into the runtime's output;
* ``direct``: the same compiled ``.so`` loaded with ``etsdk_aoti.library.Library``,
  the same weights (the eager model's tensors) and its own caches bound
  user-managed, and ``Run`` called with the same inputs.

Last line: JSON with ``etsdk_us_per_step``, ``direct_us_per_step`` and
``overhead_pct``, plus the step's parts measured separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import etsdk
from etsdk.blob import BLOB_MAGIC, BlobReader
from etsdk.signature import unwrap_blob
from etsdk_aoti import BACKEND_ID, BLOB_FEATURE
from etsdk_aoti.library import Library
from etsdk_aoti.runtime import _library_file
from etsdk_aoti.testing import llama_methods, tiny_llama


def _decode_payload(pte: Path, signature_inputs: int) -> memoryview:
    """The decode delegate's etsdk-aoti payload (the .pte holds prefill's first, then decode's)."""
    data = pte.read_bytes()
    payloads = []
    start = data.find(BLOB_MAGIC)
    while start >= 0:
        total = int.from_bytes(data[start + 16 : start + 24], "little")
        try:
            signature, payload = unwrap_blob(memoryview(data[start : start + total]), "bench")
            payloads.append((signature, payload))
        except etsdk.EtsdkError:
            pass
        start = data.find(BLOB_MAGIC, start + 1)
    decode = [p for s, p in payloads if s.inputs and s.inputs[0].shape == (1, 1)]
    return decode[0]


def _direct(payload: memoryview, wrapper: Any) -> tuple[Library, dict[str, torch.Tensor]]:
    reader = BlobReader(payload, known_features={BLOB_FEATURE})
    records = json.loads(bytes(reader.section("constants")))
    library = Library(_library_file(reader.section("library")), "cpu")
    tensors = dict(wrapper.named_parameters()) | dict(wrapper.named_buffers())
    caches = {}
    pairs = []
    for record in records:
        if record["source"] == "folded":
            continue
        tensor = tensors.get(record["fqn"])
        if record["source"] == "state":
            tensor = torch.zeros(record["shape"], dtype=getattr(torch, record["dtype"]))
            caches[record["fqn"]] = tensor
        if tensor is None:
            tensor = torch.zeros(record["nbytes"] // 4)
        pairs.append((record["name"], tensor.detach()))
    library.bind_user_managed(pairs)
    return library, caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = tiny_llama(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=8, kv_heads=4, capacity=args.capacity)
    params = sum(p.numel() for p in model.parameters())
    methods, contract = llama_methods(
        model, args.capacity, 8, prefill_backends=(BACKEND_ID,), decode_backends=(BACKEND_ID,), options={"device": "cpu"}
    )
    with tempfile.TemporaryDirectory() as tmp:
        pte = Path(tmp) / "llama.pte"
        started = time.perf_counter()
        etsdk.lower(methods, contract=contract).save(pte)
        export_s = time.perf_counter() - started
        program = etsdk.load(pte)
        session = program.new_session()
        decode = program.load_method("decode")
        library, _ = _direct(_decode_payload(pte, 2), methods["decode"].module)
        ids = torch.tensor([[11]])
        positions = [torch.tensor([i % args.capacity]) for i in range(args.steps)]
        # same compiled code, same weights: the same logits on a fresh cache
        etsdk_logits = decode.execute((ids, positions[0]), session=session)[0]
        direct_logits = library.run([ids, positions[0]])[0]
        torch.testing.assert_close(etsdk_logits, direct_logits)

        def run_etsdk() -> None:
            for p in positions:
                decode.execute((ids, p), session=session)

        def run_direct() -> None:
            for p in positions:
                library.run([ids, p])

        samples: dict[str, list[float]] = {"etsdk": [], "direct": []}
        run_etsdk(), run_direct()  # warm-up
        for _ in range(args.rounds):
            for name, fn in (("etsdk", run_etsdk), ("direct", run_direct)):
                t = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t) / args.steps * 1e6)
        library.close()
    e, d = statistics.median(samples["etsdk"]), statistics.median(samples["direct"])
    print(f"model: {params / 1e6:.1f}M parameters, capacity {args.capacity}; export took {export_s:.1f}s")
    print(f"etsdk  {e:9.1f} us/step  (rounds: {', '.join(f'{v:.0f}' for v in samples['etsdk'])})")
    print(f"direct {d:9.1f} us/step  (rounds: {', '.join(f'{v:.0f}' for v in samples['direct'])})")
    print(json.dumps({
        "etsdk_us_per_step": round(e, 2),
        "direct_us_per_step": round(d, 2),
        "overhead_pct": round((e - d) / d * 100, 2),
        "parameters": params,
    }))


if __name__ == "__main__":
    main()
