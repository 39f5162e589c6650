"""Names in an exported Triton model folder that the export and the worker's probe (which
writes the warm-up inputs) must agree on. Imports nothing: both sides may use it."""


def warmup_file(index: int) -> str:
    """The file under `<model>/warmup/` holding the example's input `index` (by position,
    since an input name may not be a file name)."""
    return f"input_{index}"
