"""Hostile input, run the way an attacker's or a broken disk's files would be: no crash, no silent corruption.

Every case runs in a worker subprocess (tests/hostile/hostile_worker.py) that reports
each case; a worker killed by a signal has that case recorded as a crash and
a new worker continues (tests/hostile/_hostile.py). Cases are seeded (``SEED``) and
sized for a few minutes on two cores: for each file of three small exports
(kv_decoder toy on the reference backend with weights outside and inside the
``.pte``; prefill on the reference backend and decode on etsdk-aoti, weights
outside), byte flips in every region (header, flatbuffer, padding, each
delegate's container, payload head and payload bulk, the program record, the
named data) and truncations inside every region; then call arguments,
contract edits and command-line misuse.

What passes: outside the weights, every flip or truncation either changes
nothing (outputs bit-identical to the clean files') or is refused with an
``EtsdkError``; flips in the weights are refused with ``verify=True`` (their
keys are content hashes) and, with the default load, never crash (the default
load does not read the weights: such a flip may change the outputs; see
docs/integrity.md). Nothing ever crashes, hangs or escapes as a non-etsdk
exception, and every refusal is one line.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.cross_plugin._artifacts import artifact
from tests.hostile._hostile import Region, describe, mutations, ptd_regions, pte_regions, run_cases

SEED = 14
FILES = [("ref_ext", "pte"), ("ref_ext", "ptd"), ("ref_emb", "pte"), ("mixed_ext", "pte"), ("mixed_ext", "ptd")]
PER_REGION = {"ref_ext": 10, "ref_emb": 6, "mixed_ext": 7}


@pytest.fixture(scope="module")
def artifacts() -> dict[str, dict[str, Any]]:
    return {kind: artifact(kind) for kind in ("ref_ext", "ref_emb", "mixed_ext")}


def _serial(art: dict[str, Any]) -> dict[str, Any]:
    return {"pte": str(art["pte"]), "ptd": str(art["ptd"]) if art["ptd"] else None}


def _keys_are_content_hashes(art: dict[str, Any]) -> bool:
    from etsdk._runtime.verification import verify

    report = verify(art["pte"], art["ptd"], methods=False)
    weights = [e for e in report.entries if e.key != "etsdk/program"]
    return bool(weights) and all(e.status == "ok" for e in weights)


def _file_cases(art: dict[str, Any], target: str, rng: random.Random) -> list[tuple[dict[str, Any], Region | None]]:
    path: Path = art[target]
    regions = pte_regions(path) if target == "pte" else ptd_regions(path)
    out = []
    for region, mutation in mutations(regions, path.stat().st_size, rng, PER_REGION[art["kind"]]):
        weights = region is not None and region.weights
        case = {
            "kind": "file",
            "artifact": _serial(art),
            "target": target,
            "mutation": mutation,
            "verify": weights,
            "label": f"{target} {region.name if region else 'file'} {mutation}",
        }
        out.append((case, region))
        if weights and mutation[0] == "flip":  # what the default load (BLAKE3 of every entry) does with the same flip
            out.append(({**case, "verify": None, "label": case["label"] + " (default load)"}, region))
    return out


def _check(cases: list[tuple[dict[str, Any], Region | None]], results: dict[int, dict[str, Any]], *, content_hashes: bool) -> list[str]:
    problems = []
    for case, region in cases:
        result = results[case["id"]]
        outcome = result["outcome"]
        if outcome in ("crash", "hang", "foreign"):
            problems.append(describe(case, result))
        elif outcome == "refused" and result.get("lines", 1) != 1:
            problems.append(describe(case, result) + " (refusal is not one line)")
        elif outcome == "wrong":
            unhashed = region is not None and region.weights and not content_hashes
            if not unhashed:  # every load hashes every entry: a damaged weight is refused, never computed with
                problems.append(describe(case, result) + " (silently wrong output)")
    return problems


def _numbered(cases: list[tuple[dict[str, Any], Region | None]]) -> list[tuple[dict[str, Any], Region | None]]:
    for i, (case, _) in enumerate(cases):
        case["id"] = i
    return cases


@pytest.mark.parametrize(("kind", "target"), FILES, ids=[f"{k}-{t}" for k, t in FILES])
def test_flips_and_truncations_are_refused_or_harmless(
    kind: str, target: str, artifacts: dict[str, dict[str, Any]]
) -> None:
    art = artifacts[kind]
    if art[target] is None:
        pytest.skip(f"{kind} has no .{target}")
    rng = random.Random(f"{SEED}-{kind}-{target}")
    cases = _numbered(_file_cases(art, target, rng))
    results = run_cases([c for c, _ in cases])
    hashes = _keys_are_content_hashes(art)
    problems = _check(cases, results, content_hashes=hashes)
    counts: dict[str, int] = {}
    for case, _ in cases:
        counts[results[case["id"]]["outcome"]] = counts.get(results[case["id"]]["outcome"], 0) + 1
    assert not problems, f"{len(problems)} of {len(cases)} cases ({counts}):\n" + "\n".join(problems[:40])
    assert counts.get("refused", 0) > 0 and counts.get("same", 0) + counts.get("refused", 0) > len(cases) // 2


@pytest.mark.parametrize("kind", ["ref_ext", "mixed_ext"])
def test_weight_flips_are_refused_by_every_load_naming_the_entry(kind: str, artifacts: dict[str, dict[str, Any]]) -> None:
    """A single flipped bit inside any weight of the .ptd: refused by the default load (BLAKE3 digests of the
    program record) and by verify=True (SHA-256 keys), the damaged entry named; verify=False runs it."""
    art = artifacts[kind]
    assert _keys_are_content_hashes(art), "every named-data key etsdk writes is a content hash"
    from etsdk._runtime.program import open_checked

    data = art["ptd"].read_bytes()
    checked = open_checked(art["pte"], art["ptd"])
    checked.files.close()
    assert checked.data_layout is not None
    entries = [e for e in checked.data_layout.entries if e.size]  # the alignment padding between them is no weight
    rng = random.Random(SEED)
    cases = []
    for i in range(24):
        entry = entries[i % len(entries)]
        flip = ["flip", entry.offset + rng.randrange(entry.size), 0x01 << (i % 8)]
        verify = (None, True)[i % 2]
        cases.append({"id": i, "kind": "file", "artifact": _serial(art), "target": "ptd", "verify": verify, "mutation": flip,
                      "label": f"weights ({'default load' if verify is None else 'verify=True'})"})
    results = run_cases(cases)
    outcomes = {results[c["id"]]["outcome"] for c in cases}
    assert outcomes == {"refused"}, [describe(c, results[c["id"]]) for c in cases]
    for case in cases:
        result = results[case["id"]]
        assert result["error"] == "IntegrityError" and "named data '" in result["message"] and "is damaged" in result["message"], result
    assert len(data) == art["ptd"].stat().st_size


def test_delegate_payload_flips(artifacts: dict[str, dict[str, Any]]) -> None:
    """Flips in a delegate's payload bulk (for etsdk-aoti: its compiled library) never crash."""
    art = artifacts["mixed_ext"]
    regions = [r for r in pte_regions(art["pte"]) if r.payload]
    rng = random.Random(SEED)
    cases = []
    for region in regions:
        for _ in range(6):
            offset = region.start + rng.randrange(region.end - region.start)
            cases.append({"kind": "file", "artifact": _serial(art), "target": "pte", "verify": False,
                          "mutation": ["flip", offset, 0xFF], "label": f"{region.name} flip {offset}"})
    for i, case in enumerate(cases):
        case["id"] = i
    results = run_cases(cases)
    bad = [describe(c, results[c["id"]]) for c in cases if results[c["id"]]["outcome"] not in ("same", "refused")]
    assert not bad, "\n".join(bad)


CALLS = [
    "dtype", "shape", "rank", "none", "int_for_tensor", "list_for_tensor", "numpy_for_tensor", "too_few", "too_many",
    "negative_position", "position_at_capacity", "huge_position", "negative_token", "token_past_vocabulary",
    "unknown_method", "foreign_session", "requires_grad",
]


@pytest.mark.parametrize("kind", ["ref_ext", "mixed_ext"])
def test_bad_call_arguments_are_refused_before_anything_runs(kind: str, artifacts: dict[str, dict[str, Any]]) -> None:
    art = artifacts[kind]
    cases = [{"id": i, "kind": "call", "artifact": _serial(art), "call": name} for i, name in enumerate(CALLS)]
    cases.append({"id": len(CALLS), "kind": "call", "artifact": _serial(art), "call": "non_contiguous"})
    results = run_cases(cases)
    for case in cases[:-1]:
        result = results[case["id"]]
        assert result["outcome"] == "refused", describe(case, result)
        assert result["lines"] == 1, result["message"]
    assert results[len(CALLS)]["outcome"] == "same", results[len(CALLS)]
    messages = {c["call"]: results[c["id"]]["message"] for c in cases[:-1]}
    assert "input 0 ('tokens', role tokens): expected int64 [1, 4], found float32 [1, 4]" in messages["dtype"]
    assert "expected int64 [1, 4], found int64 [4]" in messages["rank"]
    assert "expected a tensor int64 [1, 4], found None" in messages["none"]
    assert "input 1 ('positions', role positions): values must lie in [0, 16)" in messages["negative_position"]
    assert "found 16" in messages["position_at_capacity"]
    assert "values must lie in [0, 32) (the vocabulary holds 32 tokens), found 109" in messages["token_past_vocabulary"]


def _spec_text() -> str:
    from etsdk._plugins.core_plugin import CONTRACTS_DIR

    return (CONTRACTS_DIR / "kv_decoder" / "1.json").read_text()


def _edited(edit: Any) -> str:
    obj = json.loads(_spec_text())
    edit(obj)
    return json.dumps(obj)


def _deep(depth: int) -> str:
    """The specification with ``depth`` nested objects in its metadata (built as text: json.dumps recurses)."""
    text = _spec_text()
    at = text.index('"metadata": {') + len('"metadata": {')
    return text[:at] + '"deep": ' + '{"x": ' * depth + "1" + "}" * depth + ", " + text[at:]


CONTRACT_EDITS: list[tuple[str, Any, str]] = [
    ("device cpX", lambda o: o["states"][0].update(device="cpX"), "states[0].device: unknown device 'cpX'"),
    ("device meta", lambda o: o["states"][0].update(device="meta"), "states[0].device: unknown device 'meta'"),
    ("device quantum:7", lambda o: o["states"][1].update(device="quantum:7"), "states[1].device"),
    ("initial NaN", lambda o: o["states"][0].update(initial=float("nan")), "states[0].initial: expected a finite number"),
    ("initial Infinity", lambda o: o["states"][0].update(initial=float("inf")), "states[0].initial: expected a finite number"),
    ("initial 1e999", None, "states[0].initial: expected a finite number"),
    ("initial 1e39 in float32", lambda o: o["states"][0].update(initial=1e39), "states[0].initial"),
    ("initial 0.5 in int64", lambda o: o["states"][0].update(dtype="int64", initial=0.5), "states[0].initial"),
    ("dtype list", lambda o: o["states"][0].update(dtype=[]), "states[0].dtype: unknown dtype"),
    ("negative dim", lambda o: o["states"][0].update(shape=[1, -2]), "states[0].shape[1]"),
    ("bound on an output", lambda o: o["methods"]["decode"]["outputs"][-1].update(bound="V"), "bound"),
    ("metadata 1000 deep", None, "nested"),
    ("metadata 100 deep", None, "nested deeper than"),
]


def test_contract_edits_are_refused_naming_the_field() -> None:
    cases = []
    for i, (name, edit, _) in enumerate(CONTRACT_EDITS):
        if name == "initial 1e999":
            text = _spec_text().replace('"initial": 0.0', '"initial": 1e999', 1)
        elif name == "metadata 1000 deep":
            text = _deep(1000)
        elif name == "metadata 100 deep":
            text = _deep(100)
        else:
            text = _edited(edit)
        cases.append({"id": i, "kind": "contract", "text": text, "label": name})
    results = run_cases(cases)
    for case, (name, _, expected) in zip(cases, CONTRACT_EDITS):
        result = results[case["id"]]
        assert result["outcome"] == "refused" and result["error"] == "ContractError", describe(case, result)
        assert expected in result["message"], (name, result["message"])


def test_program_record_edits_are_refused(artifacts: dict[str, dict[str, Any]]) -> None:
    """Same-length edits of the contract embedded in a program: refused by the record's own checks (behind the
    hashes: ``verify=False``), and by the default load's hash of the record's entry whatever the edit."""
    art = artifacts["ref_ext"]
    data = art["pte"].read_bytes()
    (record,) = [r for r in pte_regions(art["pte"]) if r.name == "program record"]
    text = data[record.start : record.end]
    edits = [  # (old, new, outcome)
        (b'"device":"cpu"', b'"device":"cpX"', "refused"),
        (b'"initial":0.0', b'"initial":NaN', "refused"),
        (b'"initial":0.0', b'"initial":1.0', "refused"),
        (b'"decode":{"inputs"', b'"decodf":{"inputs"', "refused"),
        (b'"S":16', b'"S":17', "refused"),
        (b'"bound":16', b'"bound":99', "refused"),
        (b'"role":"positions"', b'"role":"tokens"', "refused"),
        (b'"dtype":"int64"', b'"dtype":"int32"', "refused"),
        (b'"producer":"etsdk', b'"producer":"other', "same"),
    ]
    cases = []
    for old, new, outcome in edits:
        at = text.find(old)
        assert at != -1, old
        new = new + b" " * (len(old) - len(new))  # JSON allows the padding
        for verify, expect in ((False, outcome), (None, "refused")):
            cases.append({"id": len(cases), "kind": "file", "artifact": _serial(art), "target": "pte", "verify": verify,
                          "mutation": ["replace", record.start + at, new.hex()], "label": f"{old.decode()} (verify={verify})",
                          "expect": expect})
    results = run_cases(cases)
    for case in cases:
        assert results[case["id"]]["outcome"] == case["expect"], describe(case, results[case["id"]])


def test_command_line_misuse_is_one_line_errors(artifacts: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    art = artifacts["ref_ext"]
    pte, ptd = str(art["pte"]), str(art["ptd"])
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(art["pte"].read_bytes()[:1000])
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    damaged_model = tmp_path / "damaged-model"
    try:
        from etsdk_hf_static.exporting.tiny import save_tiny_model
    except ImportError:
        damaged_model = None
    else:
        save_tiny_model(damaged_model)
        weights = damaged_model / "model.safetensors"
        weights.write_bytes(b"\xff" * 16 + weights.read_bytes()[16:])  # a corrupt safetensors header
    argvs = [
        ["generate", ".", "--prompt-ids", "1"],
        ["generate", str(tmp_path / "missing.pte"), "--prompt-ids", "1"],
        ["generate", pte, "--prompt-ids", "1", "--temperature", "1e-300"],
        ["generate", pte, "--prompt-ids", "1", "--temperature", "0.7", "--seed", str(2**70)],
        ["generate", pte, "--prompt-ids", "1", "--top-p", "0"],
        ["generate", pte, "--prompt-ids", "one,two"],
        ["generate", pte, "--prompt-ids", "1", "--max-new-tokens", "-1"],
        ["generate", pte, "--prompt-ids", "1", "--prompt", "hi"],
        ["generate", ptd, "--prompt-ids", "1"],
        ["verify", ptd],
        ["verify", str(truncated)],
        ["verify", pte, "--data", pte],
        ["export", "--model", str(tmp_path), "-o", str(tmp_path)],
        ["export", "--model", str(tmp_path), "-o", str(a_file / "model.pte")],
        ["export", "--model", str(tmp_path / "no-model"), "-o", str(tmp_path / "out" / "model.pte")],
    ]
    if damaged_model is not None:
        argvs.append(["export", "--model", str(damaged_model), "-o", str(tmp_path / "out" / "m.pte"), "--backend",
                      "reference", "--quiet"])
    cases = [{"id": i, "kind": "cli", "argv": argv} for i, argv in enumerate(argvs)]
    results = run_cases(cases)
    for case in cases:
        result = results[case["id"]]
        # third-party import warnings (torch, torchao) may precede it; etsdk's own error is the one last line
        lines = [line for line in result.get("stderr", "").strip().splitlines() if "etsdk" in line and "error" in line]
        assert result["outcome"] == "exit" and result["rc"] == 2, describe(case, result)
        assert len(lines) == 1 and lines[0].startswith("etsdk: error: "), (case["argv"], result["stderr"])
        assert result["stderr"].strip().splitlines()[-1] == lines[0], (case["argv"], result["stderr"])
    assert not (tmp_path / "out").exists()  # nothing was created for an export that could not start


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: an unwritable directory cannot be made")
def test_export_to_an_unwritable_directory_fails_before_loading(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cases = [{"id": 0, "kind": "cli", "argv": ["export", "--model", str(tmp_path), "-o", str(locked / "m.pte")]}]
    result = run_cases(cases)[0]
    assert result["rc"] == 2 and "no permission to write" in result["stderr"], result
