"""Layer 2, the plugin system: hook specifications, the typed records plugins register, discovery through
entry points and the process-wide registry. Imports only :mod:`etsdk._format` and :mod:`etsdk.errors`."""
