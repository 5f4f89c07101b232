"""The read machinery under the runtime: the answer cache and the worker processes (B6)."""
