"""The reference backend's graph section: a JSON list of aten calls.

Document (``graph`` section of an etsdk blob)::

    {"inputs":  [{"kind": "user", "index": i}
                 | {"kind": "constant", "key": named-data key, "dtype": str, "shape": [int]}],
     "nodes":   [{"op": "aten::add.Tensor" | "getitem", "args": [value], "kwargs": {str: value}}],
     "outputs": [value]}

Values: JSON scalars, ``{"ref": slot}`` (slots number the inputs, then the
nodes), ``{"list": [value]}``, ``{"dtype": name}``, ``{"float": "inf"|"-inf"|"nan"}``,
``{"device": str}``, ``{"layout": name}``, ``{"memory_format": name}``.
"""

from __future__ import annotations

#: Feature every reference blob requires; bump the suffix on incompatible change.
GRAPH_FEATURE = "reference.graph.v1"
GRAPH_SECTION = "graph"
#: Compile spec naming the .ptd (without extension) to put constants in.
EXTERNAL_DATA_SPEC = "external_data"
