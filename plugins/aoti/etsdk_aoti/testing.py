"""A tiny Llama-style decoder from a transformers config, for tests and benchmarks; the kernels at each level.

Random weights, grouped-query attention, transformers' own static-cache export
wrapper (``TorchExportableModuleWithStaticCache``), whose buffers become the
program's caller-owned state: per layer a key cache, a value cache and the
cumulative-length counter the wrapper writes from ``cache_position`` before
every step. The state is described by the test contract ``test_llama_kv`` v1
(``data/test_llama_kv.json``), registered in-process by :func:`register_test_contract`.

:func:`host_level_names` and :func:`run_at_level` run a test once per instruction-set level of etsdk-aoti's
kernels (``@pytest.fixture(params=host_level_names())`` whose body is ``yield from run_at_level(request.param)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import etsdk
from etsdk import Contract, MethodSource

CONTRACT_PATH = Path(__file__).resolve().parent / "data" / "test_llama_kv.json"


def tiny_llama(*, vocab: int = 128, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, capacity: int = 32, seed: int = 0) -> Any:
    """A random-weight LlamaForCausalLM configured for static-cache generation."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=capacity * 2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=capacity,
        cache_config={"batch_size": 1, "max_cache_len": capacity},
    )
    return model


def static_cache_module(model: Any, capacity: int) -> Any:
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    return TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=capacity)


def state_fqns(layers: int) -> dict[str, str]:
    out = {}
    for i in range(layers):
        out[f"key_cache_{i}"] = f"k{i}"
        out[f"value_cache_{i}"] = f"v{i}"
        out[f"cumulative_length_{i}"] = f"c{i}"
    return out


def register_test_contract() -> Contract:
    """Register ``test_llama_kv`` v1 in-process (once) and return its specification."""
    etsdk.register_contracts(
        [etsdk.ContractSpec(name="test_llama_kv", version=1, path=CONTRACT_PATH)], "etsdk-aoti-test-contracts"
    )
    return Contract.from_bytes(CONTRACT_PATH.read_bytes())


def llama_methods(model: Any, capacity: int, prefill_length: int, *, prefill_backends: tuple[str, ...], decode_backends: tuple[str, ...], options: dict[str, Any] | None = None) -> tuple[dict[str, MethodSource], Contract]:
    """Prefill / decode method sources over one static-cache wrapper, and the bound contract."""
    import torch

    wrapper = static_cache_module(model, capacity)
    config = model.config
    layers = config.num_hidden_layers
    state = state_fqns(layers)

    def source(length: int, backends: tuple[str, ...]) -> MethodSource:
        kwargs = {"input_ids": torch.zeros(1, length, dtype=torch.long), "cache_position": torch.arange(length)}
        opts = {b: dict(options or {}) for b in backends}
        return MethodSource(wrapper, (), backends, opts, strict=True, state=state, example_kwargs=kwargs)

    spec = register_test_contract()
    head_dim = config.hidden_size // config.num_attention_heads
    contract = spec.bind(T=prefill_length, S=capacity, H=config.num_key_value_heads, D=head_dim, V=config.vocab_size, L=layers)
    return {"prefill": source(prefill_length, prefill_backends), "decode": source(1, decode_backends)}, contract


def host_level_names() -> list[str]:
    """The kernel levels of this host's architecture, lowest first (those it cannot run included: they skip)."""
    from etsdk.backend import host_cpu

    from etsdk_aoti.kernels.levels import LEVELS

    return [lv.name for lv in LEVELS if lv.machine == host_cpu().machine] or ["portable"]


def run_at_level(name: str) -> Iterator[str]:
    """The body of a pytest fixture: the kernels run at level ``name`` while the test runs (the test is skipped,
    naming what this host lacks, where it cannot run it), and at the process's own level after."""
    import pytest
    from etsdk import BackendUnavailableError

    from etsdk_aoti import kernels
    from etsdk_aoti.kernels.levels import requested_level

    try:
        kernels.use_level(name)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    try:
        yield name
    finally:
        kernels.use_level(requested_level().name)
