"""Streaming generated text to a terminal: what ``etsdk generate`` and ``etsdk chat`` print as tokens arrive.

A :class:`TextStream` is an ``on_token`` callback. It decodes the ids as they arrive
(:class:`~etsdk_hf_static.runtime.detokenize.IncrementalText`: a character may span tokens, and a completion's text
reads as the continuation of its prompt) and prints what is new, except text that might still turn out to be a stop string: a stop string is never
printed, nor is the start of one until the next token shows it is not one (the rules of
:func:`~etsdk_hf_static.runtime.stops.visible_text`, which the
conversation stops by). :meth:`TextStream.finish` prints the rest of the final text and ends the line.

Importing this module is cheap (no torch): the command line uses it before anything heavy loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TextIO

from etsdk_hf_static.runtime.detokenize import IncrementalText
from etsdk_hf_static.runtime.stops import cut_at_stop, visible_text

__all__ = ["TextStream", "decode_rate"]


def decode_rate(result: Any) -> str:
    """``"decode 41.3 tokens/s"``, or ``"decode n/a (one token: no decode step)"`` when no decode step ran."""
    if len(result.token_ids) > 1:
        return f"decode {result.decode_tokens_per_s:.1f} tokens/s"
    return "decode n/a (one token: no decode step)"


class TextStream:
    """Prints generated text to ``out`` as tokens arrive (``on_token``); never a stop string from ``stops``.

    ``decode(ids)`` is the runner's ``decode_text``; ``context``: the prompt's ids when the text continues it (a
    completion), none for text on its own (a chat reply). :meth:`echo` prints the prompt first; :attr:`line_open`
    says whether something was printed without a newline after it (an error message then starts a new line).
    """

    def __init__(
        self, decode: Callable[[Sequence[int]], str], out: TextIO, stops: Sequence[str] = (), context: Sequence[int] = ()
    ) -> None:
        self.out, self.stops = out, tuple(stops)
        self.text = IncrementalText(decode, context)
        self.shown = ""  # the generated text printed so far
        self.line_open = False

    def echo(self, text: str) -> None:
        """Print ``text`` (the prompt) before the generated text."""
        self._write(text)

    def __call__(self, token: int) -> None:
        self.text.extend((token,))
        self._show(visible_text(self.text.text, self.stops))

    def finish(self, text: str | None = None) -> None:
        """Print the rest of the final ``text`` (default: the decoded ids up to a stop string), end the line."""
        if text is None:
            text = cut_at_stop(self.text.final(), self.stops)
        self._show(text)
        self.end_line()

    def end_line(self) -> None:
        """End the line when something was printed without a newline after it."""
        if self.line_open:
            self.out.write("\n")
            self.out.flush()
            self.line_open = False

    def _show(self, text: str) -> None:
        # the text grows token by token; where decoding rewrote a shown character, the screen keeps the old one
        if len(text) > len(self.shown):
            self._write(text[len(self.shown) :])
            self.shown = text

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.line_open = not text.endswith("\n")
