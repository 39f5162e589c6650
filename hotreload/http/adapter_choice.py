"""Which peft adapter a text request asks for, read off the OpenAI and generate bodies.

    {"model": "llm:a", ...}                      adapter "a" of model "llm" (lm-eval's
                                                 `--model_args model=llm:a` sends this)
    {"model": "llm", "adapter": "a", ...}        the same, as a field of its own
    {"parameters": {"adapter": "a"}, ...}        the generate extension's parameters

A model name never holds ':' (config/models.py), so the split is unambiguous. No adapter:
the model's default (`default_adapter`, else the first declared). Whether the adapter
exists is the worker's to say: it answers 400 naming the ones it serves.
"""

from __future__ import annotations

from typing import Any

from hotreload.http.replies import HttpError


def split_model(model: Any, doc: dict[str, Any]) -> tuple[Any, str | None]:
    """(model name, adapter or None) of a body's `model` and `adapter` fields."""
    adapter = doc.get("adapter")
    params = doc.get("parameters")
    if adapter is None and isinstance(params, dict):
        adapter = params.get("adapter")
    if isinstance(model, str) and ":" in model:
        model, _, named = model.partition(":")
        if adapter is not None and adapter != named:
            raise HttpError(
                400, f"'model' names adapter {named!r} and 'adapter' names {adapter!r}; send one"
            )
        adapter = named
    if adapter is not None and (not isinstance(adapter, str) or not adapter):
        raise HttpError(400, f"'adapter' must be an adapter's name (a string), got {adapter!r}")
    return model, adapter


def with_adapter(text: dict[str, Any], adapter: str | None) -> dict[str, Any]:
    """The worker's text request, naming the adapter when one was asked for."""
    return {**text, "adapter": adapter} if adapter is not None else text


def shown_name(model: str, adapter: str | None) -> str:
    """The `model` an answer names: as asked, with its adapter."""
    return f"{model}:{adapter}" if adapter is not None else model
