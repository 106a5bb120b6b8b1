"""etsdk-tensorrt: a TensorRT backend for etsdk.

A partition becomes ONNX through torch's own exporter, with declared state
(KV caches, counters) lifted to explicit engine inputs and aliased engine
outputs; the ONNX becomes a TensorRT engine at export (when TensorRT is
importable) or on first load on the target (cached by content, TensorRT version
and compute capability). The runtime binds every engine tensor by name, the
caller-owned state at its own address.

Rooms: ``plugin.py`` (registration), ``partitioner.py`` (the claimed operators),
``serializer.py`` (partition -> ONNX -> engine -> blob), ``runtime.py`` (the
binding), with ``onnx_export.py`` (lifting state, cache writes as
``TensorScatter``), ``blob_format.py`` (what a blob says), ``engine.py`` (building
and caching engines), ``device.py`` (every CUDA call) and ``availability.py``
beside them.
"""

BACKEND_ID = "EtsdkTensorRTBackend"
