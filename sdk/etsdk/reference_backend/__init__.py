"""The reference backend: a whole etsdk backend in plain Python and torch.

It exists so that the bridge, the conformance kit and third-party authors have
a backend that needs no toolchain beyond the bridge. Rooms, as in every plugin:
``plugin.py`` (registration), ``partitioner.py``, ``serializer.py``
(preprocess / blob), ``runtime.py`` (the runtime binding), and ``graph_format.py``
(the blob's graph section, shared by the serializer and the runtime).
"""

BACKEND_ID = "EtsdkReferenceBackend"
