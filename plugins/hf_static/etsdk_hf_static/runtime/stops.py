"""Stop strings: where one begins in generated text, and how much text may still turn into one.

The one rule every consumer of generated text follows: a :class:`~etsdk_hf_static.runtime.conversation.Conversation`
stops by :func:`find_stop`; a terminal stream (``etsdk generate``, ``etsdk chat``) and a server stream (``etsdk serve``)
show text only up to :func:`held_back`, so a stop string is never shown. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cut_at_stop", "find_stop", "held_back", "visible_text"]


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the earliest stop string in ``text`` begins, among matches that end after ``start``; None if none.

    ``start``: the length of the text already searched (no stop string ended inside it, or generation would
    have stopped there); a match may begin before it (a stop string completed by the newest token).
    """
    found = None
    for stop in stops:
        index = text.find(stop, max(0, start - len(stop) + 1))
        if index >= 0 and (found is None or index < found):
            found = index
    return found


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may be the start of a stop string (not to be shown yet)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to its first stop string (all of it when it holds none)."""
    cut = find_stop(text, stops)
    return text if cut is None else text[:cut]


def visible_text(text: str, stops: Sequence[str], final: bool = False) -> str:
    """What of ``text`` (all generated text so far) may be shown: up to a stop string; while not ``final``, also
    without what may still become one and without a trailing incomplete character (decoded as U+FFFD)."""
    cut = find_stop(text, stops)
    if cut is not None:
        return text[:cut]
    if final:
        return text
    return text[: len(text) - held_back(text, stops)].rstrip("\ufffd")
