"""The ``etsdk`` command line (layer 6): contract-generic commands; plugins add their own through the
``etsdk_register_commands`` hook."""

from etsdk.cli.main import main

__all__ = ["main"]
