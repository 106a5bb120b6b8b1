"""Operators the core defines for programs to call and backends to claim (``etsdk::attention``)."""
