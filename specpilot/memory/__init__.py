"""The memory: a SQLite database of every evaluated candidate, per deployment fingerprint.

`store.Memory` is the API; `schema.py` the tables and their migrations; `fingerprint.py` what
identifies a deployment; `records.py` what a query returns; `evaluate.py` evaluating a candidate
with the controller and recording it. The `specpilot memory ...` commands are `specpilot.cli.memory`.
"""
