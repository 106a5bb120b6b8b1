"""etsdk-aoti: lowers partitions with AOTInductor and runs them through the container C API.

Rooms: ``plugin.py`` (registration), ``partitioner.py``, ``serializer.py``
(compile + blob + streamed weights), ``runtime.py`` (the binding), with
``library.py`` (the container C API through ctypes), ``weights.py`` (the
weights layout) and ``threads.py`` (the per-call OpenMP team size) beside them.
"""

BACKEND_ID = "EtsdkAotiBackend"
BLOB_FEATURE = "aoti.container.v1"
#: the library takes the delegate's state as inputs after its engine inputs (config ``state_inputs``); a reader
#: without this feature would run it with too few inputs, so it is a required feature of such blobs
STATE_INPUTS_FEATURE = "aoti.state_inputs.v1"
