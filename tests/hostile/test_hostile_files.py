"""Files that change or fail under etsdk: atomic export, a full disk, files rewritten under a loaded program.

Each scenario that could fault runs in a subprocess, so a SIGBUS is a failed
test, not a dead test run. Exports are the reference backend's (seconds).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import etsdk
import pytest
import torch
from etsdk._export.output import check_output_path
from etsdk.errors import ExportError
from etsdk.reference_backend import BACKEND_ID

from tests.hostile._hostile import worker_env

ROOT = Path(__file__).resolve().parents[2]

# One script for every subprocess here: export helpers, then the scenario named on the command line.
SCRIPT = textwrap.dedent(
    """
    import inspect, json, os, sys
    import torch, etsdk
    from etsdk.reference_backend import BACKEND_ID

    def lower(seed, width, external):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()).eval()
        example = (torch.randn(2, width),)
        if not external:
            return etsdk.lower(module=model, example_inputs=example, backend=BACKEND_ID)
        if "external_data" in inspect.signature(etsdk.lower).parameters:
            return etsdk.lower(module=model, example_inputs=example, backend=BACKEND_ID, external_data="model")
        return etsdk.lower(module=model, example_inputs=example, backend=BACKEND_ID,
                           partitioner_options={"external_data": "model"})

    scenario, out = sys.argv[1], sys.argv[2]
    x = torch.ones(2, 256)
    if scenario == "export":          # argv: seed, external
        print(json.dumps([str(p) for p in lower(int(sys.argv[3]), 256, sys.argv[4] == "ext").save(out)]))
    elif scenario == "full-disk":     # a re-export under a file-size limit: one line, previous files untouched
        try:
            lower(int(sys.argv[3]), 256, sys.argv[4] == "ext").save(out)
        except etsdk.EtsdkError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            sys.exit(3)
        print(json.dumps({"error": None}))
    elif scenario in ("truncate-ptd", "rewrite-ptd", "truncate-pte"):
        ptd = out[:-4] + ".ptd"
        program = etsdk.load(out, ptd)
        first = program.run("forward", x)[0]
        target = ptd if scenario != "truncate-pte" else out
        if scenario.startswith("truncate"):
            os.truncate(target, os.path.getsize(target) // 2)
        else:
            with open(target, "r+b") as f:
                f.seek(-64, 2)
                f.write(bytes(64))
        try:
            program.run("forward", x)
            print(json.dumps({"error": None}))
        except etsdk.EtsdkError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    elif scenario == "reexport-under-load":  # argv: seed of the new program
        program = etsdk.load(out, out[:-4] + ".ptd")
        before = program.run("forward", x)[0]
        lower(int(sys.argv[3]), 256, True).save(out)
        after = program.run("forward", x)[0]
        fresh = etsdk.load(out, out[:-4] + ".ptd").run("forward", x)[0]
        print(json.dumps({"loaded_unchanged": bool(torch.equal(before, after)),
                          "fresh_differs": not bool(torch.equal(before, fresh))}))
    """
)


def _run(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = worker_env(Path(os.environ.get("TMPDIR", "/tmp")) / "etsdk-hostile-files-cache")
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True, preexec_fn=limit
    )


def _json(result: subprocess.CompletedProcess[str]) -> object:
    assert result.stdout.strip(), result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model.pte + model.ptd (256x256 weights in the .ptd) from seed 0."""
    out = tmp_path_factory.mktemp("pair") / "model.pte"
    result = _run("export", str(out), "0", "ext")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _copy(pair: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for suffix in (".pte", ".ptd"):
        (where / f"model{suffix}").write_bytes(pair.with_suffix(suffix).read_bytes())
    return where / "model.pte"


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("external", ["ext", "emb"])
def test_full_disk_leaves_the_previous_pair_byte_identical(pair: Path, tmp_path: Path, external: str) -> None:
    """``ulimit -f``: the .ptd (external) or the .pte (embedded) cannot be written; nothing changes."""
    out = _copy(pair, tmp_path)
    before = _snapshot(tmp_path)
    result = _run("full-disk", str(out), "1", external, fsize=64 * 1024)
    report = _json(result)
    assert result.returncode == 3 and report == {
        "error": "ExportError",
        "message": f"writing {out} failed: File too large; the previous files are unchanged",
    }, result.stderr[-2000:]
    assert _snapshot(tmp_path) == before  # byte-identical, and no temporary file left behind


def test_reexport_replaces_files_by_rename_and_a_loaded_program_keeps_its_own(pair: Path, tmp_path: Path) -> None:
    out = _copy(pair, tmp_path)
    report = _json(_run("reexport-under-load", str(out), "7"))
    assert report == {"loaded_unchanged": True, "fresh_differs": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ptd", "model.pte"]


@pytest.mark.parametrize("scenario", ["truncate-ptd", "rewrite-ptd", "truncate-pte"])
def test_a_file_changed_under_a_loaded_program_is_refused_not_a_crash(pair: Path, tmp_path: Path, scenario: str) -> None:
    out = _copy(pair, tmp_path)
    result = _run(scenario, str(out))
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"  # -7 would be SIGBUS
    report = _json(result)
    assert isinstance(report, dict) and report["error"] == "ProgramError", report
    assert "changed on disk since it was loaded" in report["message"] and "load it again" in report["message"]


def test_output_paths_are_checked_before_any_work(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    (tmp_path / "dir.pte").mkdir()
    (tmp_path / "data.ptd").mkdir()
    with pytest.raises(ExportError, match="it is a directory"):
        check_output_path(tmp_path / "dir.pte")
    with pytest.raises(ExportError, match="is a file, not a directory"):
        check_output_path(a_file / "sub" / "model.pte")
    with pytest.raises(ExportError, match=r"data.ptd: it is a directory"):
        check_output_path(tmp_path / "model.pte", ("data",))
    with pytest.raises(ExportError, match="names a directory"):
        check_output_path(Path("."))
    assert check_output_path(tmp_path / "new" / "deeper" / "model.pte") == tmp_path / "new" / "deeper" / "model.pte"
    assert not (tmp_path / "new").exists()


def test_save_refuses_a_directory_in_the_way_before_writing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lowered = etsdk.lower(module=torch.nn.Linear(4, 4).eval(), example_inputs=(torch.randn(1, 4),), backend=BACKEND_ID)
    (tmp_path / "model.pte").mkdir()
    with pytest.raises(ExportError, match="it is a directory"):
        lowered.save(tmp_path / "model.pte")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]


def test_only_regular_files_are_loaded(tmp_path: Path) -> None:
    fifo = tmp_path / "model.pte"
    os.mkfifo(fifo)  # opening it for reading must not wait for a writer
    with pytest.raises(etsdk.ProgramError, match="is not a regular file"):
        etsdk.load(fifo)
    with pytest.raises(etsdk.ProgramError, match="is a directory"):
        etsdk.load(tmp_path)
    with pytest.raises(etsdk.ProgramError, match="is not a regular file"):
        etsdk.load("/dev/zero")


def test_content_hash_check_names_the_damaged_entry(tmp_path: Path) -> None:
    import hashlib

    from etsdk._format.content_hash import content_digest, hash_entries, raise_on_mismatch
    from etsdk._format.program_file import Entry
    from etsdk.errors import IntegrityError

    data = os.urandom(3 << 20) + b"tail"
    path = tmp_path / "blob.bin"
    path.write_bytes(b"head" + data)
    digest = hashlib.sha256(data).hexdigest()
    entries = [Entry(f"etsdk_ref/{digest}", 4, len(data)), Entry("etsdk/program", 0, 4), Entry(digest, 4, len(data) - 1)]
    assert content_digest(entries[0].key) == digest and content_digest("etsdk/program") is None
    fd = os.open(path, os.O_RDONLY)
    try:
        checks = hash_entries(fd, entries, "blob.bin")
    finally:
        os.close(fd)
    assert [c.status for c in checks] == ["ok", "unverifiable", "mismatch"]
    with pytest.raises(IntegrityError, match=r"blob.bin: named data '[0-9a-f]{64}' \(3145731 bytes\) is damaged"):
        raise_on_mismatch(checks)


def test_verify_reports_every_entry_and_method(pair: Path) -> None:
    from etsdk._runtime.verification import verify

    report = verify(pair, pair.with_suffix(".ptd"))
    assert report.ok and {e.status for e in report.entries} <= {"ok", "unverifiable"}
    assert report.methods == (("forward", "loaded"),)
    assert json.loads(json.dumps(report.to_json()))["ok"] is True


@pytest.mark.parametrize("damage", ["no instructions", "output never written"])
def test_a_method_that_would_compute_nothing_is_refused(tmp_path: Path, damage: str) -> None:
    """A damaged instruction list can still parse (one flipped bit of its length did, in the seeded suite): the
    method would return whatever its planned memory held. Refused before anything runs, naming the method."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    good = tmp_path / "good.pte"
    etsdk.lower(module=model, example_inputs=(torch.randn(2, 8),), backend=BACKEND_ID).save(good)
    etsdk.load(good)  # the undamaged program loads
    pte = deserialize_pte_binary(good.read_bytes())
    plan = pte.program.execution_plan[0]
    if damage == "no instructions":
        plan.chains[0].instructions = []
        expected = r"method 'forward': delegate 0 is never called by an instruction"
    else:  # the delegate is still called, but the method's output is no longer one of its arguments
        call = plan.chains[0].instructions[-1].instr_args
        output = plan.outputs[0]
        call.args = [a for a in call.args if a != output]
        expected = r"method 'forward': output 0 \(value \d+\) is written by no instruction"
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(serialize_pte_binary(pte)))
    with pytest.raises(etsdk.ProgramError, match=expected):
        etsdk.load(bad)
