"""One TensorRT delegate per method: the largest group of claimed operators; the rest runs beside it."""

from __future__ import annotations

from pathlib import Path

import etsdk
import torch
from etsdk.backend import aten_name
from etsdk_tensorrt import BACKEND_ID


class Split(torch.nn.Module):
    """Two groups TensorRT claims, split by ``floor`` (which it does not)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(21)
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x)) * 4
        return self.second(torch.floor(h))


def test_the_largest_group_is_the_engine_and_the_rest_runs_beside_it(tmp_path: Path, standin: object) -> None:
    model = Split().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    lowered = etsdk.lower(module=model, example_inputs=(x,), backend=BACKEND_ID, partitioner_options={"device": "cpu"})
    graph = lowered.manager.exported_program("forward").graph
    outside = {str(aten_name(n.target)).split(".")[0] for n in graph.nodes if n.op == "call_function"}
    assert {"aten::floor", "aten::addmm"} <= outside  # the second linear missed the largest group
    lowered.save(tmp_path / "split.pte")
    program = etsdk.load(tmp_path / "split.pte")
    assert program.delegates("forward") == (BACKEND_ID,)
    torch.testing.assert_close(program.run("forward", x)[0], model(x))
    assert standin.executions == 1  # type: ignore[attr-defined]
