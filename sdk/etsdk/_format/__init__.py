"""Layer 1, bytes on disk: the blob container and its delegate envelope, structural checks of ``.pte`` /
``.ptd`` files, dtype codes, format versions and model fingerprints. Imports nothing above it."""
