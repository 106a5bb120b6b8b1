"""The reference backend's graph section: a JSON list of aten calls.

Document (``graph`` section of an etsdk blob)::

    {"inputs":  [{"kind": "user", "index": i}
                 | {"kind": "constant", "key": named-data key, "dtype": str, "shape": [int]}
                 | {"kind": "state", "state": state identity}],
     "nodes":   [{"op": "aten::add.Tensor" | "getitem", "args": [value], "kwargs": {str: value}}],
     "outputs": [value],
     "state_updates": [{"state": state identity, "value": value}]}

State inputs are bound to the current session's storage on every call. A state
update whose value is ``index_put`` / ``index_copy`` of that same state, with
no later reader of the old value, runs in place (``index_put_``): no copy of
the cache per step. Any other update is copied into the storage after the call.

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
