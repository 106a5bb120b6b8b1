"""etsdk-aoti: lowers partitions with AOTInductor and runs them through the container C API.

Rooms: ``plugin.py`` (registration), ``partitioner.py``, ``serializer.py`` (compile + streamed weights; builds
the blob's record), ``blob_format.py`` (the blob: typed records, ``encode`` / ``decode``), ``runtime.py`` (the
binding), with ``library.py`` (the container C API through ctypes), ``weights.py`` (the weights layout),
``threads.py`` (the per-call OpenMP team size) and ``cpu.py`` (the CPU target: Inductor's options, the check at
load) beside them.
"""

from etsdk_aoti.blob_format import BLOB_FEATURE, STATE_INPUTS_FEATURE

BACKEND_ID = "EtsdkAotiBackend"

__all__ = ["BACKEND_ID", "BLOB_FEATURE", "STATE_INPUTS_FEATURE"]
