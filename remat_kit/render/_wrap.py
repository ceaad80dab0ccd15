"""Lines broken between tokens, never inside one.

rich wraps prose at spaces, and folds a word longer than the line mid-word (``qu`` /
``ery_proj``); it also parts a figure from its unit (``0.3`` / ``ms``). :func:`wrap` breaks at
spaces, keeps a figure with its unit, and splits a word longer than the line only after one of
the characters that join tokens (``+ , / : =``, then ``_``), folding mid-token only where a
token alone is longer than the line.
"""

from __future__ import annotations

import re

from rich.text import Text

__all__ = [
    "BREAK_AFTER",
    "cell",
    "wrap",
    "wrap_lines",
]

#: The characters after which a long name may be broken: the joints between its tokens, the
#: joints between whole names first (``+``, ``,`` ...), inside a name (``_``) only if none is near.
BREAK_AFTER = ("+,/:=", "_")

_SIGNS = ("=", "~", "<", ">", "<=")
_FIGURE = re.compile(r"^[~(]?[-+]?[\d.,]+%?$")
_UNIT = re.compile(r"^(GiB|MiB|KiB|GB|MB|B|s|ms|us|TFLOP|GFLOP|MFLOP|tok/s)\b")


def wrap_lines(text: str, width: int) -> list[tuple[int, int]]:
    """Where ``text`` is cut into lines at most ``width`` characters long.

    Args:
      text: plain text; its newlines are kept as line ends.
      width: the longest line.

    Returns:
      ``(start, end)`` of each line in ``text`` (the spaces at a break belong to no line).

    Example:
      >>> s = "megatron: equivalent to names:save=attn_out+query_proj"
      >>> [s[a:b] for a, b in wrap_lines(s, 24)]
      ['megatron: equivalent to', 'names:save=attn_out+', 'query_proj']
    """
    width = max(width, 1)
    lines: list[tuple[int, int]] = []
    offset = 0
    for para in text.split("\n"):
        lines += [(offset + a, offset + b) for a, b in _wrap_paragraph(para, width)]
        offset += len(para) + 1
    return lines


def _words(para: str) -> list[tuple[int, int]]:
    """The spans of ``para``'s words, a figure and its unit taken as one word, and a lone
    sign (``= X``, ``~ X``) with the word it marks."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", para)]
    glued: list[tuple[int, int]] = []
    for start, end in spans:
        last = para[glued[-1][0] : glued[-1][1]] if glued else ""
        if (
            glued
            and para[glued[-1][1] : start] == " "
            and ((_FIGURE.match(last) and _UNIT.match(para[start:end])) or last in _SIGNS)
        ):
            glued[-1] = (glued[-1][0], end)
        else:
            glued.append((start, end))
    return glued


def _wrap_paragraph(para: str, width: int) -> list[tuple[int, int]]:
    lines: list[tuple[int, int]] = []
    start = end = None  # the line being filled
    indent = len(para) - len(para.lstrip(" "))
    for w_start, w_end in _words(para):
        if start is None:
            w_start = 0 if w_start <= indent else w_start  # a paragraph keeps its indent
        while True:
            if start is None:
                if w_end - w_start <= width:
                    start, end = w_start, w_end
                    break
                cut = _cut(para, w_start, w_start + width)
                lines.append((w_start, cut))
                w_start = cut
                continue
            if w_end - start <= width:
                end = w_end
                break
            room = start + width  # the word overflows: break inside it if a joint is near
            cut = _cut(para, w_start, room, hard=False) if w_end - w_start > width else None
            if cut is not None and cut - w_start >= 4:
                lines.append((start, cut))
                start, w_start = None, cut
                continue
            lines.append((start, end))
            start = None
    if start is not None:
        lines.append((start, end))
    return lines or [(0, 0)]


def _cut(para: str, start: int, limit: int, hard: bool = True) -> int | None:
    """The end of the longest piece of the word at ``start`` ending after a joint, up to
    ``limit`` (a joint between names where one is in the last half of the piece, else one
    inside a name); ``limit`` itself (a fold) when there is none and ``hard``."""
    end = min(limit, len(para))
    for joints, reach in zip(BREAK_AFTER, (start + (end - start) // 2, start), strict=True):
        for i in range(end - 1, reach, -1):
            if para[i] in joints:
                return i + 1
    return limit if hard else None


def wrap(text: str | Text, width: int) -> Text:
    """``text`` broken into lines of at most ``width`` columns between tokens.

    Args:
      text: plain text or a rich Text (its styles are kept).
      width: the longest line.

    Returns:
      A Text whose lines are at most ``width`` long, not to be wrapped again
      (``no_wrap``).

    Example:
      >>> print(wrap("recomputation 0.3 ms", 18).plain)
      recomputation
      0.3 ms
    """
    text = Text(text) if isinstance(text, str) else text
    pieces = [text[a:b] for a, b in wrap_lines(text.plain, width)]
    out = Text("\n").join(pieces)
    out.no_wrap = True
    out.overflow = "ignore"
    out.style = text.style
    out.justify = text.justify
    return out


def cell(text: str, width: int) -> str:
    """A table cell's plain text in lines of at most ``width``, broken between tokens: for a
    column that is the answer (``no_wrap``), which keeps a long name whole rather than cut.

    Example:
      >>> print(cell("names:save=query_proj+key_proj", 16))
      names:save=
      query_proj+
      key_proj
    """
    return "\n".join(text[a:b] for a, b in wrap_lines(text, width))
