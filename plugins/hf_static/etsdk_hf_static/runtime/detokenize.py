"""Generated ids as text, decoded as they arrive: what a generation's text, its stop strings and its stream read.

Decoding every id generated so far at every step costs a reply of n tokens n^2 / 2 decodes; and a reply decoded on
its own reads differently from the same ids after the prompt: a SentencePiece tokenizer drops the space before a
text's first word, so a completion of ``"The capital of France is"`` by ``▁Paris`` would read ``"Paris"`` and the
two texts would join as ``"...isParis"``. :class:`IncrementalText` does what serving engines do (a window of the
last few ids, its text subtracted): each id costs two decodes of a few ids, and with ``context`` (the ids before
the first one) the text is exactly the continuation of what they read, so prompt + completion reads as the whole.

An id that ends inside a multi-byte character (the tokenizer decodes it to U+FFFD) waits for the ids that complete
it; :meth:`IncrementalText.final` gives it up at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["CONTEXT_IDS", "IncrementalText"]

#: the ids of ``context`` kept before the first generated one: enough for any tokenizer's joining rules
CONTEXT_IDS = 6
_INCOMPLETE = "\ufffd"


class IncrementalText:
    """The text of the ids given to :meth:`extend`, read as the continuation of ``context`` (may be empty: the text
    then stands alone, as a chat reply does). ``decode(ids) -> str`` is the model's ``decode_text``."""

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids = list(context)[-CONTEXT_IDS:]
        self._prefix = 0  # the window's first id: its text up to _read is what the text ends with
        self._read = len(self._ids)  # ids before this are in the text
        self._count = 0
        self.text = ""  # the complete characters decoded so far

    @property
    def count(self) -> int:
        """Ids given so far (``context`` not counted)."""
        return self._count

    def extend(self, ids: Iterable[int]) -> str:
        """Add ``ids``; returns the text they added (may be empty: an incomplete character waits)."""
        before = len(self.text)
        for token in ids:
            self._ids.append(int(token))
            self._count += 1
            window = self._ids[self._prefix :]
            known = str(self._decode(self._ids[self._prefix : self._read]))
            now = str(self._decode(window))
            if len(now) > len(known) and not now.endswith(_INCOMPLETE):
                self.text += now[len(known) :]
                self._prefix, self._read = self._read, len(self._ids)
            elif now == known and known:
                # the ids since the last text read as nothing after it (special tokens): they leave the window,
                # which keeps the text ids a later word joins to; a run of them would make every decode longer.
                # Not while the window reads as nothing yet: there a SentencePiece decoder strips a leading space,
                # so a bare "▁" reads as nothing alone and as " " before the next word
                del self._ids[self._read :]
        return self.text[before:]

    def final(self) -> str:
        """The text with whatever is still held back (an incomplete character at the end, as the tokenizer reads it)."""
        if self._read == len(self._ids):
            return self.text
        known = str(self._decode(self._ids[self._prefix : self._read]))
        return self.text + str(self._decode(self._ids[self._prefix :]))[len(known) :]
