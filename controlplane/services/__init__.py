"""The rules of the seeds, one module per noun. Services raise ``shared.errors``."""
