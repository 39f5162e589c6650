"""Taking a model beyond hotreload: `hotreload export triton` (triton.py) writes a Triton
Inference Server model repository. Manager side: nothing here imports torch; the model is
built in a probe process (hotreload/worker/export_probe.py)."""
