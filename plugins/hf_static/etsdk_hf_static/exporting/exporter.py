"""Export a transformers causal LM as an hf_static program: ``prefill`` (T tokens) and ``decode`` (1).

A model whose every layer is full attention becomes a version-1 program; one with
sliding-window layers (Gemma 2/3, Mistral, Qwen2 with a window shorter than the
context) a version-2 program, whose sliding-window layers keep ring caches of
R = W + T - 1 rows (:mod:`etsdk_hf_static.metadata`). With ``kv_cache="int8"``
either becomes a version-3 program: int8 caches with a scale per row and head.

Both methods trace one :class:`~etsdk_hf_static.exporting.module.StaticCausalLM`, so they
share its cache buffers, which become the program's caller-owned state (one
storage per session, written by whichever backend runs the method). Each method
may go to its own backend (prefill on one, decode on another).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import etsdk
from etsdk import (
    Capability,
    Contract,
    ExportError,
    ExportRequest,
    MethodSource,
    QuantizationPlan,
    check_free_space,
    check_output_path,
    format_bytes,
)

from etsdk_hf_static.exporting.attention import filled_attention, lacking_filled_attention, wanted
from etsdk_hf_static.exporting.batched import BatchedDecodeLM
from etsdk_hf_static.exporting.module import (
    StaticCausalLM,
    WindowedCausalLM,
    keeps_chosen_logits,
    layer_kinds,
    state_fqns,
)
from etsdk_hf_static.masks import causal_mask, slot_mask
from etsdk_hf_static.metadata import (
    CONTRACT_NAME,
    METADATA_FORMAT_V2,
    METADATA_FORMAT_V3,
    HfStaticMetadata,
    check_cache_dtype,
    ring_rows,
    tokenizer_dir,
)

__all__ = ["DEFAULT_CONTEXT_LENGTH", "DEFAULT_PREFILL_LENGTH", "default_sizes", "export", "export_request"]

#: T when none is given (or S, when S is smaller): a chat message with its template (20 to 60 tokens) is one
#: prefill call, a first message with a system prompt one or two; a short message pads at most 63 rows, and a
#: context re-prefilled after a shift of ~1000 rows is 16 calls. Each call computes T rows whatever the prompt,
#: so a larger T costs every short message more; the decode tail (a prompt's last partial chunk that would run
#: past S) is at most T-1 tokens, only in the last T rows of the context.
DEFAULT_PREFILL_LENGTH = 64
#: S when none is given: the model's ``max_position_embeddings``, at most this (the whole window of a long-context
#: model would make every decode step attend over, and every session allocate, a cache of that many rows).
DEFAULT_CONTEXT_LENGTH = 2048
METHODS = ("prefill", "decode")
#: What ``weights_dtype`` (``etsdk export --weights-dtype``) takes: ``auto`` keeps the checkpoint's.
WEIGHTS_DTYPES = ("auto", "float32", "bfloat16", "float16")
#: The feature an etsdk-aoti payload requires when it records the CPU its code needs (plugins/aoti/README.md):
#: the program record lists it for each such delegate, so the export can say what CPU the program needs.
AOTI_CPU_FEATURE = "aoti.cpu_target.v1"
#: What to export with for a fleet of machines, per architecture (``etsdk.backend.cpu_target_names``).
_FLEET_TARGETS = {"x86_64": "x86-64-v3 (AVX2) or x86-64-v4 (AVX-512)", "aarch64": "armv8-a or armv8.2-a+dotprod"}


def checkpoint_dtype(directory: Path) -> str:
    """The dtype a transformers model directory's ``config.json`` gives its weights (``dtype``, or the older
    ``torch_dtype``): ``"bfloat16"``, ``"float16"`` or ``"float32"`` (also when it names none)."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    named = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    if not isinstance(named, str):
        text = config.get("text_config") if isinstance(config, dict) else None
        named = (text.get("dtype") or text.get("torch_dtype")) if isinstance(text, dict) else None
    return named if named in ("bfloat16", "float16") else "float32"


def _load_model(
    model: Any, quiet: bool, allow_requantize: bool = False, weights_dtype: str = "auto", meta_trace: bool = False
) -> tuple[Any, Path | None, Any]:
    """The model, its directory (None for a model object or a GGUF file) and, for a GGUF file, its tokenizer.

    A model directory is loaded in its checkpoint's own dtype, memory-mapped from its safetensors files (nothing
    copied); ``weights_dtype`` is applied afterwards, weight by weight (:func:`_cast_weights`). With
    ``meta_trace`` it is built from its config with its parameters on the meta device instead
    (:mod:`etsdk_hf_static.exporting.meta_build`)."""
    if not isinstance(model, (str, Path)):
        return model, None, None
    directory = Path(model)
    if directory.suffix.lower() == ".gguf":
        if not directory.is_file():
            raise ExportError(f"GGUF file not found: {directory}")
        from etsdk_hf_static.exporting.gguf_import import load_gguf

        loaded_gguf = load_gguf(directory, allow_requantize=allow_requantize, quiet=quiet)
        return loaded_gguf.model, None, loaded_gguf.tokenizer
    if allow_requantize:
        raise ExportError("--allow-requantize applies to a GGUF file (--model FILE.gguf)")
    if not (directory / "config.json").is_file():
        raise ExportError(f"{directory} is not a transformers model directory (no config.json) nor a .gguf file")
    import torch
    from transformers import AutoModelForCausalLM

    dtype = checkpoint_dtype(directory)
    wanted_dtype = dtype if weights_dtype == "auto" else weights_dtype
    converted = "" if wanted_dtype == dtype else f", converted to {wanted_dtype}"
    if meta_trace:
        from etsdk_hf_static.exporting.meta_build import described_model

        _say(f"building {directory / 'config.json'} on the meta device ({dtype} weights{converted}, read when stored)", quiet)
        return described_model(directory, getattr(torch, dtype)), directory, None
    _say(f"loading {directory} ({dtype} weights{converted})", quiet)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    except Exception as exc:  # noqa: BLE001 - e.g. SafetensorError from a damaged weights file: one clear error
        raise ExportError(
            f"transformers could not load a causal LM from {directory}: {type(exc).__name__}: {exc}"
        ) from exc
    return loaded.eval(), directory, None


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(f"etsdk-hf-static: {text}", file=sys.stderr, flush=True)


def _eos_ids(model: Any) -> tuple[int, ...]:
    found: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and item not in found:
                found.append(item)
    return tuple(found)


def default_sizes(config: Any, prefill_length: int | None = None, context_length: int | None = None) -> tuple[int, int, str]:
    """T and S for a model ``config`` (a transformers text config): the given ones, else the defaults.

    S: the model's ``max_position_embeddings`` capped at :data:`DEFAULT_CONTEXT_LENGTH` (that cap when the
    config has none); T: :data:`DEFAULT_PREFILL_LENGTH`, or S when S is smaller. Returns ``(T, S, why)``,
    ``why`` saying where each default came from (empty when both were given).
    """
    notes = []
    if context_length is None:
        limit = getattr(config, "max_position_embeddings", None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            context_length = min(limit, DEFAULT_CONTEXT_LENGTH)
            capped = f", capped at {DEFAULT_CONTEXT_LENGTH}" if limit > DEFAULT_CONTEXT_LENGTH else ""
            notes.append(f"S from max_position_embeddings {limit}{capped}")
        else:
            context_length = DEFAULT_CONTEXT_LENGTH
            notes.append(f"S default {DEFAULT_CONTEXT_LENGTH} (the model gives no max_position_embeddings)")
    if prefill_length is None:
        prefill_length = min(DEFAULT_PREFILL_LENGTH, context_length)
        notes.append(f"T default {prefill_length}")
    return prefill_length, context_length, "; ".join(notes)


def metadata_for(
    model: Any, prefill_length: int, context_length: int, cache_dtype: str = "float32", *, full_logits: bool = False
) -> HfStaticMetadata:
    """The metadata record of ``model`` exported with T = ``prefill_length``, S = ``context_length`` and caches of
    ``cache_dtype`` (``"float32"``, or ``"int8"``: version 3); ``full_logits`` False: prefill computes its last real
    row's logits only (every row's all the same for a model without transformers' ``logits_to_keep``)."""
    check_cache_dtype(cache_dtype)
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    if prefill_length <= 0 or context_length <= 0:
        raise ExportError(f"prefill length and context length must be positive, found T={prefill_length}, S={context_length}")
    if prefill_length > context_length:
        raise ExportError(f"prefill length T={prefill_length} exceeds the context length S={context_length}")
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and context_length > limit:
        raise ExportError(f"context length S={context_length} exceeds the model's max_position_embeddings ({limit})")
    bos = getattr(config, "bos_token_id", None)
    kinds, window = layer_kinds(model, context_length)
    windows: dict[str, Any] = {}
    if window is not None:
        windows = {"layer_kinds": kinds, "window": window, "ring_rows": ring_rows(window, prefill_length, context_length),
                   "format": METADATA_FORMAT_V2}
    if cache_dtype == "int8":
        windows = {**windows, "layer_kinds": kinds, "format": METADATA_FORMAT_V3, "cache_dtype": "int8"}
    return HfStaticMetadata(
        context_length=context_length,
        prefill_length=prefill_length,
        vocab_size=config.vocab_size,
        layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        eos_ids=tuple(e for e in _eos_ids(model) if 0 <= e < config.vocab_size),
        architecture=type(model).__name__,
        bos_id=bos if isinstance(bos, int) and 0 <= bos < config.vocab_size else None,
        full_logits=full_logits or not keeps_chosen_logits(model),
        **windows,
    )


def _contract(meta: HfStaticMetadata, decode_batch: int | None = None) -> Contract:
    """The record: the specification bound to ``meta``'s sizes (and B with ``decode_batch``: the record then has the
    optional ``decode_batch`` method, else not) with the metadata attached."""
    spec_file = etsdk.get_contract(CONTRACT_NAME, meta.version)
    spec = Contract.from_bytes(spec_file.path.read_bytes(), where=str(spec_file.path))
    return meta.attach(spec.bind(**meta.dims, **({"B": decode_batch} if decode_batch else {})))


def method_sources(
    model: Any, meta: HfStaticMetadata, backends: Mapping[str, str], options: Mapping[str, Mapping[str, Any]] | None = None,
    decode_batch: int | None = None,
) -> dict[str, MethodSource]:
    """The two method sources over one static-cache wrapper of ``model``; with ``decode_batch`` B a third,
    ``decode_batch`` (:class:`~etsdk_hf_static.exporting.batched.BatchedDecodeLM`: decode for B sessions in one call,
    on decode's backend)."""
    import torch

    wrapper: torch.nn.Module
    if meta.version == 1:
        wrapper = StaticCausalLM(model, meta.context_length, full_logits=meta.full_logits, skip_padding=True).eval()
        state = state_fqns(meta.layers)
    else:
        wrapper = WindowedCausalLM(
            model, meta.context_length, meta.ring_rows, meta.layer_kinds, meta.cache_dtype, full_logits=meta.full_logits,
            skip_padding=True,
        ).eval()
        state = {name: name for name, _ in wrapper.named_buffers(recurse=False)}
    sources = {}
    for name, rows in (("prefill", meta.prefill_length), ("decode", 1)):
        example: tuple[torch.Tensor, ...] = (
            torch.zeros(1, rows, dtype=torch.long),
            torch.arange(rows),
            causal_mask(0, rows, rows, meta.context_length),
        )
        if meta.ring_rows is not None and meta.window is not None:  # version 2, or 3 with sliding-window layers
            example += (slot_mask(0, rows, rows, meta.ring_rows, meta.window),)
        elif meta.version == 3:  # no ring caches: a one-column window_mask nobody reads
            example += (torch.ones(1, 1, rows, 1, dtype=torch.bool),)
        backend = backends[name]
        backend_options = {backend: dict(options[backend])} if options and backend in options else {}
        sources[name] = MethodSource(wrapper, example, (backend,), backend_options, strict=True, state=state)
    if decode_batch:
        batched = BatchedDecodeLM(
            model, meta.context_length, decode_batch, ring_rows=meta.ring_rows, kinds=meta.layer_kinds or None,
            cache_dtype=meta.cache_dtype,
        ).eval()
        one = sources["decode"]
        batch_rows = tuple(t.repeat(decode_batch, *([1] * (t.dim() - 1))) for t in one.example_inputs)
        sources["decode_batch"] = MethodSource(
            batched, batch_rows, one.backends, one.partitioner_options,
            strict=True, state=batched.state_slots(),
        )
    return sources


def export(
    model: Any,
    output: str | Path,
    *,
    backend: str = "aoti",
    prefill_backend: str | None = None,
    decode_backend: str | None = None,
    prefill_length: int | None = None,
    context_length: int | None = None,
    external_data: bool = False,
    partitioner_options: Mapping[str, Mapping[str, Any]] | None = None,
    quantization: QuantizationPlan | None = None,
    allow_requantize: bool = False,
    attention: str = "auto",
    kv_cache: str = "float32",
    weights_dtype: str = "auto",
    meta_trace: bool = False,
    cpu_target: str | None = None,
    full_logits: bool = False,
    decode_batch: int | None = None,
    quiet: bool = False,
) -> list[Path]:
    """Export ``model`` (a transformers model directory or a ``*ForCausalLM`` object) to ``output``.

    Writes the ``.pte`` (and ``<stem>.ptd`` with ``external_data``), plus the
    tokenizer in ``<stem>.tokenizer/`` when the model directory has one. Backends
    are ids or short names (``aoti``, ``reference``). ``context_length`` (S)
    defaults to the model's ``max_position_embeddings`` capped at
    :data:`DEFAULT_CONTEXT_LENGTH`, ``prefill_length`` (T) to
    :data:`DEFAULT_PREFILL_LENGTH` or S if smaller (:func:`default_sizes`).
    ``quantization``: quantize the model's linear layers, embedding and output
    head first (:func:`etsdk.quantize_model`; a model object is changed in place).
    ``model`` may be a GGUF file: its Q8_0 / Q4_0 / Q4_1 blocks are kept as they
    are and its tokenizer saved (:mod:`etsdk_hf_static.exporting.gguf_import`);
    ``allow_requantize`` dequantizes its other tensor types instead of refusing.
    ``attention``: ``"filled"`` makes attention read only the cache rows in use
    (``etsdk::attention``, :mod:`etsdk_hf_static.exporting.attention`), ``"full"`` every row
    (masked), ``"auto"`` filled when every chosen backend claims it.
    ``kv_cache``: ``"int8"`` keeps the key / value caches as int8 rows with a float32
    scale per row and head (hf_static v3: a quarter of the cache's bytes, read by
    every decode step and written into every saved session); ``"float32"`` (default).
    ``weights_dtype``: the dtype of the program's linear and embedding weights. ``"auto"`` (default) keeps a
    checkpoint's bfloat16 / float16 (half the bytes of float32, read memory-mapped from its files) and a
    model object's own; ``"float32"`` upcasts them; ``"bfloat16"`` / ``"float16"`` converts to that (a
    checkpoint's weights are converted one at a time into temporary files, never all in memory). Whatever
    the weights, the program computes in float32 (:func:`etsdk.keep_16bit_weights`): its caches and logits
    are the contract's float32.
    ``meta_trace``: build a model directory's model from its ``config.json`` with every parameter on the meta
    device, trace against their descriptions, and bind the checkpoint's safetensors tensors (memory-mapped) into
    the traced programs before the backends compile and store them: transformers never loads the weights, and
    tracing reads none (a weight the export converts, such as a 16-bit norm computed in float32, is converted
    before). The program is the same, byte for byte in its weights. Not with ``quantization`` (quantizing needs
    the values first) nor a model object or GGUF file.
    ``cpu_target``: the CPU every etsdk-aoti partition's code is compiled for (its partitioner option
    ``cpu_target``): ``"native"`` (what the partitioner does by default: this host) or a baseline a fleet shares
    (``"x86-64-v3"``, ``"x86-64-v4"``: :func:`etsdk.backend.cpu_target_names`); a machine that lacks one of its
    features refuses the program at load. The last progress line says what CPU the program needs.
    ``full_logits``: prefill returns every row's logits (to score a text: perplexity, per-token quality); by
    default it computes its last real row's only, the one generation reads, and leaves the other rows zero (the
    vocabulary projection is skipped for the rest: a fifth of SmolLM2-135M's prefill multiplies).
    ``decode_batch`` B (2 or more): the program also gets ``decode_batch``, one decode step for B conversations in
    one call (each its own session's caches; every weight read once for the B rows), on decode's backend; what
    ``etsdk serve`` uses when several requests are decoding. ``etsdk export --decode-batch 4``.
    Returns the paths written.
    """
    started = time.perf_counter()
    output = check_output_path(output, (Path(output).stem,) if external_data else ())
    chosen = {  # before loading anything: a mistyped backend fails fast
        "prefill": etsdk.resolve_backend_id(prefill_backend or backend),
        "decode": etsdk.resolve_backend_id(decode_backend or backend),
    }
    wanted(attention, list(chosen.values()))  # a wrong mode or a backend that cannot: refused before loading
    if check_cache_dtype(kv_cache) == "int8":  # the int8 form of etsdk::attention is part of what FILLED_ATTENTION promises
        lacking = lacking_filled_attention(list(chosen.values()))
        if lacking:
            raise ExportError(
                f"kv_cache='int8' needs every backend to compute attention over int8 cache rows "
                f"({Capability.FILLED_ATTENTION.value}); {', '.join(lacking)} does not declare it (use kv_cache='float32')"
            )
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ExportError(f"weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, found {weights_dtype!r}")
    if decode_batch is not None and (isinstance(decode_batch, bool) or not isinstance(decode_batch, int) or decode_batch < 2):
        raise ExportError(
            f"decode_batch (--decode-batch, size B) is how many conversations one decode_batch call advances: an integer of 2 or more, "
            f"found {decode_batch!r}"
        )
    if meta_trace:
        _check_meta_trace(model, quantization)
    partitioner_options, target = _with_cpu_target(cpu_target, chosen, partitioner_options)
    loaded, directory, gguf_tokenizer = _load_model(model, quiet, allow_requantize, weights_dtype, meta_trace)
    with contextlib.ExitStack() as owned:
        # a model the export loaded keeps its converted (quantized, cast) weights in files, mapped, not in memory
        converts = quantization is not None or weights_dtype != "auto"
        spill = owned.enter_context(etsdk.WeightSpill()) if converts and directory is not None else None
        written, cpu_code = _export_loaded(
            loaded, directory, gguf_tokenizer, output, chosen, attention, kv_cache, weights_dtype, quantization, spill,
            prefill_length, context_length, partitioner_options, external_data, full_logits, decode_batch, quiet,
        )
    size = sum(p.stat().st_size for p in written if p.suffix in (".pte", ".ptd"))
    _say(f"done in {time.perf_counter() - started:.1f}s ({size / 2**20:.1f} MiB): {', '.join(str(p) for p in written)}", quiet)
    if cpu_code:
        _say(cpu_summary(target), quiet)
    return written


def _with_cpu_target(
    cpu_target: str | None, chosen: Mapping[str, str], options: Mapping[str, Mapping[str, Any]] | None
) -> tuple[dict[str, dict[str, Any]], str]:
    """The partitioner options with ``cpu_target`` given to etsdk-aoti, and the CPU target its partitions get;
    a name that is not a target, or a target without an etsdk-aoti method, refused before anything loads."""
    from etsdk.backend import cpu_target_names

    resolved: dict[str, dict[str, Any]] = {}
    for key, value in (options or {}).items():
        resolved.setdefault(etsdk.resolve_backend_id(key), {}).update(value)
    if cpu_target is None:
        aoti = next((b for b in chosen.values() if b in resolved and "cpu_target" in resolved[b]), None)
        return resolved, str(resolved[aoti]["cpu_target"]) if aoti is not None else "native"
    names = cpu_target_names()
    if cpu_target not in names:
        raise ExportError(f"--cpu-target: unknown CPU target {cpu_target!r}; choose one of: {', '.join(names)}")
    aoti = etsdk.resolve_backend_id("aoti")
    if aoti not in chosen.values():
        raise ExportError(
            f"--cpu-target applies to etsdk-aoti ({aoti}) partitions; no method uses it "
            f"(prefill -> {chosen['prefill']}, decode -> {chosen['decode']})"
        )
    given = resolved.get(aoti, {}).get("cpu_target", cpu_target)
    if given != cpu_target:
        raise ExportError(f"--cpu-target {cpu_target} and the backend option aoti.cpu_target={given} disagree; give one")
    resolved.setdefault(aoti, {})["cpu_target"] = cpu_target
    return resolved, cpu_target


def cpu_summary(target: str) -> str:
    """The export's last line when it compiled CPU code for etsdk-aoti: what CPU the program needs, and how to
    export for a fleet of machines."""
    from etsdk.backend import cpu_target, cpu_target_names, host_cpu

    host = host_cpu()
    if target == "native":
        levels = [n for n in cpu_target_names(host.machine)[1:] if cpu_target(n, host).runs_on(host)]
        base = cpu_target(levels[-1], host).features if levels else frozenset()
        extra = " ".join(f for f in host.isa_features() if f not in base)
        has = f"{levels[-1]}{' + ' + extra if extra else ''}" if levels else f"{host.machine} {extra or 'baseline only'}"
        fleet = _FLEET_TARGETS.get(host.machine) or " or ".join(cpu_target_names(host.machine)[1:])
        advice = f"; to run on other machines, export with --cpu-target {fleet}" if fleet else ""
        return f"built for this host's CPU (native: {has}){advice}"
    wanted = cpu_target(target, host)
    needs = " ".join(sorted(wanted.features)) or "the baseline"
    lacks = host.lacks(wanted.features)
    here = f"; this host lacks {' '.join(lacks)}, so it cannot run the program itself" if lacks else ""
    return f"built for {target}: runs on {wanted.machine} CPUs with {needs}{here}"


def _export_loaded(
    loaded: Any,
    directory: Path | None,
    gguf_tokenizer: Any,
    output: Path,
    chosen: dict[str, str],
    attention: str,
    kv_cache: str,
    weights_dtype: str,
    quantization: QuantizationPlan | None,
    spill: Any,
    prefill_length: int | None,
    context_length: int | None,
    partitioner_options: Mapping[str, Mapping[str, Any]] | None,
    external_data: bool,
    full_logits: bool,
    decode_batch: int | None,
    quiet: bool,
) -> tuple[list[Path], bool]:
    """:func:`export` once the model is loaded: quantize, trace, lower and write; the paths written, and whether
    an etsdk-aoti delegate records a CPU target (it compiled C++: a CPU library, or a CUDA library's host code)."""
    import torch

    from etsdk_hf_static.exporting.module import WRAPPED

    if weights_dtype != "auto":
        _cast_weights(loaded, getattr(torch, weights_dtype), spill)
    filled = wanted(attention, list(chosen.values()), loaded)
    if quantization is not None:
        _quantize(loaded, quantization, quiet, spill)
    widened = etsdk.keep_16bit_weights(loaded)
    if widened.kept:
        _say(widened.summary(), quiet)
    prefill_length, context_length, why = default_sizes(loaded.config.get_text_config(), prefill_length, context_length)
    meta = metadata_for(loaded, prefill_length, context_length, kv_cache, full_logits=full_logits)
    options: dict[str, dict[str, Any]] = {
        b: dict(o) for b, o in ((etsdk.resolve_backend_id(k), v) for k, v in (partitioner_options or {}).items())
    }
    _say(
        f"{meta.architecture or type(loaded).__name__}: {meta.layers} layers{_windows(meta)}, vocab {meta.vocab_size}, "
        f"T={meta.prefill_length}, S={meta.context_length}{f' ({why})' if why else ''}; "
        f"prefill -> {chosen['prefill']}, decode -> {chosen['decode']}; attention over "
        f"{'the filled rows' if filled else 'every row'}{'; int8 caches (hf_static v3)' if meta.version == 3 else ''}"
        f"; prefill logits of {'every row' if meta.full_logits else 'the last real row'}"
        f"{f'; decode_batch over {decode_batch} conversations' if decode_batch else ''}",
        quiet,
    )
    _plan(loaded, output, quiet)
    with torch.no_grad(), filled_attention(loaded, filled):
        sources = method_sources(loaded, meta, chosen, options, decode_batch)
        weights = None
        if directory is not None and any(t.device.type == "meta" for t in loaded.parameters()):  # meta_trace
            from etsdk_hf_static.exporting.meta_build import checkpoint_tensors, weight_values

            weights = weight_values(loaded, checkpoint_tensors(directory), WRAPPED, spill)
        try:
            lowered = etsdk.lower(
                sources, contract=_contract(meta, decode_batch), external_data=output.stem if external_data else None,
                weights=weights, quiet=quiet,
            )
        finally:  # the model's linear layers lose the traced padding hooks (a model object is the caller's)
            for source in sources.values():
                if getattr(source.module, "padding", None) is not None:
                    source.module.padding.close()
    written = lowered.save(output)
    if directory is not None:
        written += _save_tokenizer(directory, output, quiet)
    elif gguf_tokenizer is not None:
        gguf_tokenizer.save_pretrained(tokenizer_dir(output))
        written.append(tokenizer_dir(output))
    cpu_code = any(
        AOTI_CPU_FEATURE in (entry.signature.payload_features or ()) for m in lowered.methods for entry in lowered.delegates(m)
    )
    return written, cpu_code


def _check_meta_trace(model: Any, quantization: QuantizationPlan | None) -> None:
    """``meta_trace`` applies to a transformers model directory exported without quantization: refused up front."""
    if not isinstance(model, (str, Path)) or Path(model).suffix.lower() == ".gguf":
        raise ExportError("meta_trace (--meta-trace) builds a transformers model directory's model on the meta device; "
                          f"found {'a GGUF file' if isinstance(model, (str, Path)) else f'a {type(model).__name__} object'}")
    if quantization is not None:
        raise ExportError("meta_trace (--meta-trace) does not combine with quantization (--quantize): quantizing reads "
                          "every weight's values before tracing; leave one out")


def _cast_weights(model: Any, dtype: Any, spill: Any = None) -> None:
    """Cast ``model``'s linear and embedding weights to ``dtype`` in place (a tied weight stays one tensor); other
    tensors are left to :func:`etsdk.keep_16bit_weights`, and quantized layers' stored tensors are not touched.
    ``spill`` (an :class:`etsdk.WeightSpill`) makes each cast weight in a file instead of memory."""
    import torch

    cast: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or not isinstance(weight, torch.Tensor):
            continue
        if not weight.is_floating_point() or weight.dtype == dtype:
            continue
        if id(weight) not in cast:  # (a meta weight stays a description; its value is converted when bound)
            converted = spill.convert(weight, dtype) if spill is not None and not weight.is_meta else weight.detach().to(dtype)
            cast[id(weight)] = torch.nn.Parameter(converted, requires_grad=False)
        module.weight = cast[id(weight)]


def _windows(meta: HfStaticMetadata) -> str:
    if meta.version == 1 or meta.window is None:
        return ""
    count = meta.layer_kinds.count("window")
    return f" ({count} sliding-window of {meta.window} positions in ring caches of R={meta.ring_rows} rows: {CONTRACT_NAME} v{meta.version})"


def model_size(model: Any) -> tuple[int, int]:
    """``(parameters, weight bytes)`` of ``model`` as it will be exported: each storage once (tied weights share
    one), a quantized layer's parameters counted by its shape and its bytes as stored."""
    import torch
    from etsdk import QuantizedEmbedding, QuantizedLinear

    seen: set[tuple[int, int]] = set()
    count = size = 0
    for module in model.modules():
        quantized = isinstance(module, (QuantizedLinear, QuantizedEmbedding))
        if quantized and (module.qdata.untyped_storage().data_ptr(), module.qdata.storage_offset()) not in seen:
            count += module.rows * module.columns  # once for a tied embedding and head (they share qdata)
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if tensor is None or name.startswith(("key_cache", "value_cache", "cumulative_length")):
                continue
            key = (id(tensor), -1) if tensor.is_meta else (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if key in seen:
                continue
            seen.add(key)
            size += tensor.numel() * tensor.element_size()
            if not quantized and isinstance(tensor, torch.nn.Parameter):
                count += tensor.numel()
    return count, size


def _plan(model: Any, output: Path, quiet: bool) -> None:
    """Say what the export will take before it starts, and refuse it up front when the disk cannot hold it.

    Backends that store weights with ``NamedDataWriter.add_weight`` (etsdk-aoti, the reference backend) share
    one entry per weight, so the program holds about the weights' bytes (a backend that keeps its own copy adds
    another). Weights memory-mapped from the checkpoint are copied from it when the program is written; others
    (quantized, upcast, a model object's) are spooled to temporary files until then (:func:`etsdk.spool_size`).
    Memory: the export adds about 0.2x the weights to what a model in memory takes; a checkpoint's memory-mapped
    weights are read 64 MiB at a time, their pages dropped once read (``hf_static_export_memory.py``).
    """
    count, size = model_size(model)
    spooled = etsdk.spool_size([*model.parameters(), *model.buffers()])
    _say(
        f"{count / 1e6:.1f}M parameters, {format_bytes(size)} of weights: writes about {format_bytes(size)} to "
        f"{output.parent if str(output.parent) else '.'}"
        + (f" and spools {format_bytes(spooled)} to temporary files" if spooled else " (copied from their files)")
        + (
            f"; memory: the loaded model plus about {format_bytes(int(size * 0.2))}"
            if spooled
            else "; memory: the weights are read in place from their files, 64 MiB at a time"
        ),
        quiet,
    )
    check_free_space(output, size, spooled_bytes=spooled)


def _quantize(model: Any, plan: QuantizationPlan, quiet: bool, spill: Any = None) -> None:
    """Quantize ``model`` by ``plan``, refusing a layer the format cannot hold as an ExportError naming it;
    ``spill`` (an :class:`etsdk.WeightSpill`) keeps the quantized weights in files instead of memory."""
    _say(f"quantizing ({plan.describe()})", quiet)
    try:
        report = etsdk.quantize_model(model, plan, spill=spill)
    except ValueError as exc:
        raise ExportError(f"cannot quantize {type(model).__name__}: {exc}") from None
    _say(report.summary(), quiet)
    for name, why in report.kept.items():
        if not why.startswith("no format given"):
            _say(f"kept in float: {name} ({why})", quiet)


def _save_tokenizer(directory: Path, output: Path, quiet: bool) -> list[Path]:
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return []
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        _say(f"tokenizer in {directory} not saved ({exc}); use --prompt-ids with etsdk generate", quiet)
        return []
    target = tokenizer_dir(output)
    tokenizer.save_pretrained(target)
    return [target]


_Option = TypeVar("_Option", str, bool)


def export_request(request: ExportRequest) -> list[Path]:
    """``etsdk export`` entry point (the runner spec's ``exporter``)."""
    unknown = sorted(set(request.method_backends) - set(METHODS))
    if unknown:
        raise ExportError(f"hf_static has methods {', '.join(METHODS)}; no method {', '.join(unknown)}")
    known = ("attention", "kv_cache", "weights_dtype", "meta_trace", "cpu_target", "full_logits")
    unknown_options = sorted(set(request.options) - set(known))
    if unknown_options:
        raise ExportError(
            f"hf_static's exporter takes the options {', '.join(known[:-1])} and {known[-1]}, not {', '.join(unknown_options)}"
        )
    options = request.options
    kinds = {str: "a string", bool: "true or false"}

    def option(name: str, default: _Option) -> _Option:
        """The option's value (``default`` when not given or None), of ``default``'s type: never a truthy string
        read as true, nor anything else as false."""
        value = options.get(name)
        if value is None:
            return default
        if not isinstance(value, type(default)):
            raise ExportError(f"hf_static's option {name} takes {kinds[type(default)]}, found {value!r}")
        return value

    attention, kv_cache = option("attention", "auto"), option("kv_cache", "float32")
    weights_dtype, cpu_target = option("weights_dtype", "auto"), option("cpu_target", "") or None
    meta_trace, full_logits = option("meta_trace", False), option("full_logits", False)
    unknown_sizes = sorted(set(request.sizes) - {"T", "S", "B"})
    if unknown_sizes:
        raise ExportError(
            f"hf_static takes sizes T (prefill length), S (context length) and B (conversations per decode_batch call), "
            f"not {', '.join(unknown_sizes)}"
        )
    return export(
        request.model,
        request.output,
        backend=request.backend,
        prefill_backend=request.method_backends.get("prefill"),
        decode_backend=request.method_backends.get("decode"),
        prefill_length=request.sizes.get("T"),
        context_length=request.sizes.get("S"),
        external_data=request.external_data,
        quiet=request.quiet,
        partitioner_options=request.partitioner_options,
        quantization=request.quantization,
        allow_requantize=request.allow_requantize,
        attention=attention,
        kv_cache=kv_cache,
        weights_dtype=weights_dtype,
        meta_trace=meta_trace,
        full_logits=full_logits,
        cpu_target=cpu_target,
        decode_batch=request.sizes.get("B"),
    )
