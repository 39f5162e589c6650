"""GPU layer: NVML telemetry, Xid events, GPU reset. The only package that imports pynvml."""
