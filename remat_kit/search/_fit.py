"""What the two boundary searches' answers share: a note in words and a JSON form."""

from __future__ import annotations

import dataclasses
from typing import Any

from remat_kit.notes import words


class NotedFit:
    """Mixin of :class:`~remat_kit.search.batch.BatchFit` and :class:`~remat_kit.search.seq.
    SeqFit`: frozen dataclasses with a ``note`` field and a ``fits`` property."""

    @property
    def message(self) -> str:
        """The note in words, one line (``""`` without a note)."""
        note = self.note  # type: ignore[attr-defined]
        return "" if note is None else words(note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the note as ``Note.to_dict()``, plus ``fits`` and ``message``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        out["note"] = None if out["note"] is None else out["note"].to_dict()
        return {**out, "fits": self.fits, "message": self.message}  # type: ignore[attr-defined]
