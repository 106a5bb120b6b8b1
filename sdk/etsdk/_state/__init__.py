"""Layer 3, contracts and state: I/O contracts, delegate signatures and the program record, and the
caller-owned session storage (with snapshots) that every delegate binds by identity."""
