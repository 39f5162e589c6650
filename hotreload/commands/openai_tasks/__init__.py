"""Tiny lm-eval tasks bundled for `hotreload check --openai`, and the runner it starts."""
