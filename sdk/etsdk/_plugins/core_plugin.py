"""The core's own registrations: the contract specifications shipped in ``etsdk/contracts``."""

from __future__ import annotations

from pathlib import Path

from etsdk._plugins.hookspec import hookimpl
from etsdk._plugins.specs import ContractSpec

ETSDK_PLUGIN_API = ">=2,<3"

CONTRACTS_DIR = Path(__file__).resolve().parents[1] / "contracts"


@hookimpl
def etsdk_register_contracts() -> list[ContractSpec]:
    return [
        ContractSpec(
            name="kv_decoder",
            version=1,
            path=CONTRACTS_DIR / "kv_decoder" / "1.json",
            description="prefill / decode over per-layer caller-owned key/value caches, logits last",
        ),
        ContractSpec(
            name="kv_decoder",
            version=2,
            path=CONTRACTS_DIR / "kv_decoder" / "2.json",
            description="kv_decoder v1 and an optional decode_batch: one decode step over B sessions in one call",
        ),
        ContractSpec(
            name="hf_static",
            version=1,
            path=CONTRACTS_DIR / "hf_static" / "1.json",
            description="Hugging Face causal LM over a static cache: prefill (T) / decode (1), masks, counters",
        ),
        ContractSpec(
            name="hf_static",
            version=2,
            path=CONTRACTS_DIR / "hf_static" / "2.json",
            description="hf_static with sliding-window layers: full caches of S rows and ring caches of R rows, two masks",
        ),
        ContractSpec(
            name="hf_static",
            version=3,
            path=CONTRACTS_DIR / "hf_static" / "3.json",
            description="hf_static v2 with int8 key / value caches, a float32 scale per row and head beside each",
        ),
    ]
