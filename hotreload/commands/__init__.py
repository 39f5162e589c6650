"""The commands that run a session in this process (`hotreload serve`, `hotreload watch`).

A command builds the engine's `Session` and starts the front ends beside it: the KServe v2
HTTP endpoint (handed to the session as a starter, so it opens before the models warm up)
and, for `watch` in a terminal, the dashboard process. The engine imports none of this and
starts no front end of its own (checked by the import contracts in pyproject.toml).
"""
