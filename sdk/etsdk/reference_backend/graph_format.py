"""The reference backend's graph section: a JSON list of aten calls.

Document (``graph`` section of an etsdk blob)::

    {"inputs":  [{"kind": "user", "index": i}
                 | {"kind": "constant", "key": named-data key, "dtype": str, "shape": [int]}
                 | {"kind": "state", "index": i}],
     "nodes":   [{"op": "aten::add.Tensor" | "getitem", "args": [value], "kwargs": {str: value}}],
     "outputs": [value],
     "state_updates": [{"index": i, "value": value}]}

A state input or update names the position ``i`` of its binding in the
delegate's signature (``context.states``); at run time it is the session's
storage the core pushes into ``execute(args, state)``. A state update whose
value is ``index_put`` / ``index_copy`` of that same state, with no later
reader of the old value, runs in place (``index_put_``): no copy of the cache
per step. Any other update is copied into the storage after the call.

Values: JSON scalars, ``{"ref": slot}`` (slots number the inputs, then the
nodes), ``{"list": [value]}``, ``{"dtype": name}``, ``{"float": "inf"|"-inf"|"nan"}``,
``{"device": str}``, ``{"layout": name}``, ``{"memory_format": name}``.
"""

from __future__ import annotations

#: Feature every reference blob requires; bump the suffix on incompatible change.
GRAPH_FEATURE = "reference.graph.v2"
GRAPH_SECTION = "graph"
