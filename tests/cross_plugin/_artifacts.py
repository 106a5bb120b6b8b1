"""Small exported programs shared by the hostile-input and leak suites, built once per content.

Exports are cached on disk under a key of everything that shapes them (the
sources of etsdk and etsdk-aoti, the torch and executorch versions), so the
suites of one machine compile the AOTInductor program once, and a change to the
code rebuilds it. ``ETSDK_TEST_ARTIFACTS`` overrides the cache root.

* ``ref_ext``: the kv_decoder toy (stateful, with a contract) on the reference
  backend, weights in ``weights.ptd``;
* ``ref_emb``: the same with its weights inside the ``.pte``;
* ``mixed_ext``: prefill on the reference backend, decode on etsdk-aoti
  (AOTInductor on CPU), weights in ``weights.ptd``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "EtsdkReferenceBackend"
AOTI = "EtsdkAotiBackend"
PREFILL = 4
KINDS = {
    "ref_ext": (REFERENCE, REFERENCE, True),
    "ref_emb": (REFERENCE, REFERENCE, False),
    "mixed_ext": (REFERENCE, AOTI, True),
}


def _key() -> str:
    digest = hashlib.sha256()
    for dist in ("torch", "executorch"):
        digest.update(metadata.version(dist).encode())
    for tree in (ROOT / "sdk" / "etsdk", ROOT / "plugins" / "aoti" / "etsdk_aoti", ROOT / "contracts"):
        for path in sorted(tree.rglob("*")):
            if path.suffix in (".py", ".json", ".cpp") and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("ETSDK_TEST_ARTIFACTS")
    return Path(root) if root else Path(tempfile.gettempdir()) / "etsdk-test-artifacts" / _key()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def artifact(kind: str) -> dict[str, Any]:
    """``{"pte": Path, "ptd": Path | None, "kind": kind}`` for one of :data:`KINDS`, exported on first use."""
    root = cache_root()
    target = root / kind
    with _locked(root):
        if not (target / "done").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
            try:
                _export(kind, staging)
                (staging / "done").write_text("ok")
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    ptd = target / "weights.ptd"
    return {"kind": kind, "pte": target / "toy.pte", "ptd": ptd if ptd.is_file() else None}


def _export(kind: str, out: Path) -> None:
    import etsdk
    from etsdk.testing.toy_decoder import ToyDecoder, kv_decoder_contract, kv_decoder_methods

    prefill_backend, decode_backend, external = KINDS[kind]
    model = ToyDecoder(seed=1).eval()
    methods = kv_decoder_methods(model, PREFILL, prefill_backends=(prefill_backend,), decode_backends=(decode_backend,))
    contract = kv_decoder_contract(model, PREFILL)
    kwargs: dict[str, Any] = {}
    new_api = "external_data" in inspect.signature(etsdk.lower).parameters
    if external and new_api:
        kwargs["external_data"] = "weights"
    options: dict[str, dict[str, Any]] = {}
    for backend in {prefill_backend, decode_backend}:
        opts: dict[str, Any] = {"device": "cpu"} if backend == AOTI else {}
        if external and not new_api:
            opts["external_data"] = "weights"
        options[backend] = opts
    methods = {
        name: replace(source, partitioner_options={b: options[b] for b in source.backends})
        for name, source in methods.items()
    }
    etsdk.lower(methods, contract=contract, **kwargs).save(out / "toy.pte")
    (out / "info.json").write_text(json.dumps({"kind": kind, "prefill": prefill_backend, "decode": decode_backend}))
