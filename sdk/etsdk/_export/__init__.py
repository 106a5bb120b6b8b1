"""Layer 4a, export: :func:`etsdk.lower` as named stages, the core's wrapper around every partitioner, the
:class:`~etsdk.backend.Partition` handed to ``preprocess`` and the operator partitioner. Never imports the
runtime layer."""
