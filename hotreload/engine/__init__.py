"""The manager side: router, endpoint, worker handles, reloads. Pure asyncio.

Never imports torch, textual or pynvml (tests/test_layers.py proves it): the manager must
start fast, stay small, and never create a CUDA context of its own.
"""
