"""Whether a request fits a program's context, and the one message when it does not.

One formula counts the cache rows every request takes (:func:`rows_needed`), and one message names the rows and
the fixes that apply (:func:`does_not_fit`, :func:`context_fixes`), for ``Conversation.generate`` and
``prefill``, ``etsdk generate`` (which checks before the program loads) and ``etsdk chat`` alike. Imports
nothing heavy: the command line uses it before torch is imported.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["context_fixes", "does_not_fit", "rows_needed"]


def rows_needed(used: int, prompt: int, new: int) -> int:
    """Cache rows a request takes: the rows in use, plus the prompt's tokens, plus the new tokens.

    The one formula of every "does not fit" check (``Conversation.generate`` and ``prefill``, ``etsdk
    generate``, ``etsdk chat``): a context of S rows holds S tokens. ``used`` is the conversation's tokens
    (its written rows and its pending token, whose row the next call writes).
    """
    return used + prompt + new


def context_fixes(
    used: int, prompt: int, new: int, context_length: int, *, chat: bool = False, exchanges: int = 0,
    new_tokens_knob: str = "--max-new-tokens",
) -> list[str]:
    """What would make a request of ``prompt`` + ``new`` tokens after ``used`` rows fit, most direct first.

    Fewer new tokens when the prompt leaves room for some, named by ``new_tokens_knob`` (the command line's flag,
    or a server request's field; not in a chat: ``etsdk chat`` fits each reply into the room left itself); freeing
    rows when some are in use (``/reset``, ``/rewind N`` in a chat with
    ``exchanges``); a shorter prompt when it alone does not leave room for one new token; always, a program
    exported with a longer context.
    """
    fixes = []
    room = context_length - used - prompt
    if not chat and 1 <= room < new:
        fixes.append(f"fewer new tokens ({new_tokens_knob} {room})")
    if chat and exchanges:
        fixes.append("/reset or /rewind N to free rows")
    elif not chat and used:
        fixes.append("fewer tokens in the conversation (reset() or rewind(n))")
    if room < 1:
        fixes.append("a shorter message" if chat else "a shorter prompt")
    fixes.append(
        f"a program exported with a longer context (etsdk export --context-length, more than {context_length} "
        "and at most the model's max_position_embeddings)"
    )
    return fixes


def does_not_fit(used: int, prompt: int, new: int, context_length: int, fixes: Sequence[str]) -> str:
    """The one "does not fit" message: the rows counted by :func:`rows_needed` (the rows in use when there are
    some), then ``fixes``: ``"37 prompt token(s) + 128 new token(s) = 165 cache rows, but ..."``."""
    needed = rows_needed(used, prompt, new)
    ways = fixes[0] if len(fixes) == 1 else f"{', '.join(fixes[:-1])} or {fixes[-1]}"
    in_use = f"{used} row(s) in use + " if used else ""
    return (
        f"{in_use}{prompt} prompt token(s) + {new} new token(s) = {needed} cache rows, "
        f"but the program's context length S is {context_length}; to make it fit: {ways}"
    )
