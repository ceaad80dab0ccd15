"""What the two boundary searches' answers share: a note in words and a JSON form."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from remat_kit.notes import Note, words


class NotedFit:
    """Base of :class:`~remat_kit.search._batch.BatchFit` and :class:`~remat_kit.search._seq.
    SeqFit`: frozen dataclasses with a ``note`` field and a ``fits`` property."""

    # What each subclass has, declared here so that these methods are typed: a dataclass's
    # fields, its note, and whether it fits.
    __dataclass_fields__: ClassVar[dict[str, Any]]
    note: Note | None

    @property
    def fits(self) -> bool:
        raise NotImplementedError  # each search says what fitting means for it

    @property
    def message(self) -> str:
        """The note in words, one line (``""`` without a note)."""
        return "" if self.note is None else words(self.note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the note as ``Note.to_dict()``, plus ``fits`` and ``message``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["note"] = None if self.note is None else self.note.to_dict()
        return {**out, "fits": self.fits, "message": self.message}
