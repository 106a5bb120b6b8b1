"""etsdk-aoti: lowers partitions with AOTInductor and runs them through the container C API.

Rooms: ``plugin.py`` (registration), ``partitioner.py``, ``serializer.py``
(compile + blob + streamed weights), ``runtime.py`` (the binding), with
``library.py`` (the container C API through ctypes) and ``weights.py`` (the
weights layout) beside them.
"""

BACKEND_ID = "EtsdkAotiBackend"
BLOB_FEATURE = "aoti.container.v1"
