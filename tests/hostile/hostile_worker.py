"""Runs hostile-input cases one after another and reports each; the parent restarts it after a crash.

Protocol: one JSON case per line on stdin; for each, the worker prints
``{"start": id}`` before it runs the case and ``{"id": id, "outcome": ...}``
after. A worker killed by a signal leaves a started case without a result:
the parent records that case as a crash and starts a new worker for the rest.

Outcomes: ``same`` (the program ran and its outputs are bit-identical to the
clean program's), ``wrong`` (it ran and they differ), ``refused`` (an
``EtsdkError``; its type and message are reported), ``foreign`` (any other
exception: a failure of the suite), and for CLI cases the exit status.
Only public behaviour is exercised: ``etsdk.load``, ``Program.run``,
sessions, ``Contract.from_bytes`` and the ``etsdk`` command line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

import etsdk  # noqa: E402
from etsdk.errors import EtsdkError  # noqa: E402

PROMPT = torch.tensor([[3, 5, 7, 9]])
DECODE = [(torch.tensor([[1]]), torch.tensor([4])), (torch.tensor([[4]]), torch.tensor([5]))]

_clean_bytes: dict[str, bytes] = {}
_clean_outputs: dict[str, torch.Tensor] = {}
_scratch = Path(tempfile.mkdtemp(prefix="etsdk-hostile-"))


def generate(program: etsdk.Program) -> torch.Tensor:
    """Prefill then two decode steps in a fresh session: every logit, flattened."""
    session = program.new_session()
    outs = [program.run("prefill", PROMPT, torch.arange(4), session=session)[0]]
    outs += [program.run("decode", token, position, session=session)[0] for token, position in DECODE]
    return torch.cat([o.flatten() for o in outs])


def _bytes(path: str) -> bytes:
    if path not in _clean_bytes:
        _clean_bytes[path] = Path(path).read_bytes()
    return _clean_bytes[path]


def _clean(artifact: dict[str, Any]) -> torch.Tensor:
    key = artifact["pte"]
    if key not in _clean_outputs:
        _clean_outputs[key] = generate(etsdk.load(artifact["pte"], artifact["ptd"]))
    return _clean_outputs[key]


def _mutate(data: bytes, mutation: list[Any]) -> bytes:
    kind = mutation[0]
    if kind == "flip":
        out = bytearray(data)
        out[mutation[1]] ^= mutation[2]
        return bytes(out)
    if kind == "truncate":
        return data[: mutation[1]]
    if kind == "replace":  # [replace, offset, hex]: same-length rewrite
        new = bytes.fromhex(mutation[2])
        return data[: mutation[1]] + new + data[mutation[1] + len(new) :]
    raise ValueError(f"unknown mutation {kind}")


def _file_case(case: dict[str, Any]) -> dict[str, Any]:
    artifact = case["artifact"]
    clean = _clean(artifact)
    pte = _scratch / "model.pte"
    ptd = _scratch / "model.ptd"
    files = {"pte": (artifact["pte"], pte), "ptd": (artifact["ptd"], ptd)}
    for name, (source, target) in files.items():
        if source is None:
            continue
        data = _bytes(source)
        if name == case["target"]:
            data = _mutate(data, case["mutation"])
        target.unlink(missing_ok=True)  # a new file each time: a loaded program never sees a rewrite
        target.write_bytes(data)
    got = generate(etsdk.load(pte, ptd if artifact["ptd"] else None, verify=case.get("verify")))
    return {"outcome": "same" if torch.equal(got, clean) else "wrong"}


def _call_case(case: dict[str, Any]) -> dict[str, Any]:
    artifact = case["artifact"]
    clean = _clean(artifact)
    program = etsdk.load(artifact["pte"], artifact["ptd"])
    session = program.new_session()
    name = case["call"]
    good = (PROMPT, torch.arange(4))
    calls: dict[str, Any] = {
        "dtype": lambda: program.run("prefill", PROMPT.float(), torch.arange(4), session=session),
        "shape": lambda: program.run("prefill", PROMPT[:, :3], torch.arange(3), session=session),
        "rank": lambda: program.run("prefill", PROMPT.flatten(), torch.arange(4), session=session),
        "none": lambda: program.run("prefill", None, torch.arange(4), session=session),
        "int_for_tensor": lambda: program.run("prefill", 3, torch.arange(4), session=session),
        "list_for_tensor": lambda: program.run("prefill", [[3, 5, 7, 9]], torch.arange(4), session=session),
        "numpy_for_tensor": lambda: program.run("prefill", PROMPT.numpy(), torch.arange(4), session=session),
        "too_few": lambda: program.run("prefill", PROMPT, session=session),
        "too_many": lambda: program.run("prefill", *good, torch.arange(4), session=session),
        "negative_position": lambda: program.run("prefill", PROMPT, torch.arange(4) - 1, session=session),
        "position_at_capacity": lambda: program.run("decode", torch.tensor([[1]]), torch.tensor([16]), session=session),
        "huge_position": lambda: program.run("decode", torch.tensor([[1]]), torch.tensor([2**62]), session=session),
        "negative_token": lambda: program.run("prefill", PROMPT - 10, torch.arange(4), session=session),
        "token_past_vocabulary": lambda: program.run("prefill", PROMPT + 100, torch.arange(4), session=session),
        "unknown_method": lambda: program.run("forward", *good, session=session),
        "foreign_session": lambda: program.run(
            "prefill", *good, session=etsdk.load(artifact["pte"], artifact["ptd"]).new_session()
        ),
        "requires_grad": lambda: program.run("prefill", PROMPT, torch.arange(4).float().requires_grad_(), session=session),
    }
    if name == "non_contiguous":
        # a transposed view holding the same values: accepted, same outputs
        tokens = torch.tensor([[3], [5], [7], [9]]).t()
        program2 = etsdk.load(artifact["pte"], artifact["ptd"])
        s2 = program2.new_session()
        outs = [program2.run("prefill", tokens, torch.arange(4), session=s2)[0]]
        outs += [program2.run("decode", t, p, session=s2)[0] for t, p in DECODE]
        got = torch.cat([o.flatten() for o in outs])
        return {"outcome": "same" if torch.equal(got, clean) else "wrong"}
    before = {k: v.clone() for k, v in session.state.items()}
    calls[name]()
    return {"outcome": "accepted", "state_changed": any(not torch.equal(before[k], v) for k, v in session.state.items())}


def _cli_case(case: dict[str, Any]) -> dict[str, Any]:
    from etsdk.cli.main import main

    err = io.StringIO()
    out = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(case["argv"])
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    return {"outcome": "exit", "rc": rc, "stderr": err.getvalue()[-2000:], "stdout": out.getvalue()[-500:]}


def _contract_case(case: dict[str, Any]) -> dict[str, Any]:
    from etsdk._state.contract import Contract

    contract = Contract.from_bytes(case["text"].encode())
    if contract.is_bound:
        from etsdk._state.session import Session

        Session(contract)  # storage is created from the parsed record: devices, dtypes, initial values
    return {"outcome": "accepted"}


def run(case: dict[str, Any]) -> dict[str, Any]:
    kind = case["kind"]
    handler = {"file": _file_case, "call": _call_case, "cli": _cli_case, "contract": _contract_case}[kind]
    try:
        result = handler(case)
    except EtsdkError as exc:
        message = str(exc)
        result = {"outcome": "refused", "error": type(exc).__name__, "message": message[:600], "lines": message.count("\n") + 1}
    except Exception as exc:  # noqa: BLE001 - a foreign exception is a finding, reported to the parent
        result = {
            "outcome": "foreign",
            "error": type(exc).__name__,
            "message": str(exc)[:600],
            "traceback": traceback.format_exc()[-3000:],
        }
    result["id"] = case["id"]
    return result


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        sys.stdout.write(json.dumps({"start": case["id"]}) + "\n")
        sys.stdout.flush()
        sys.stdout.write(json.dumps(run(case)) + "\n")
        sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: the suite is about the cases


if __name__ == "__main__":
    main()
