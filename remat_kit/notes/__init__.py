"""Notes: what the library has to tell the user, as data, and the one line each kind reads as.

A :class:`Note` is a kind and the figures behind it (bytes, specs, names), never a sentence:
``MemoryReport.notes``, ``Fit.note``, ``Plan.note``, ``Advice.note`` and
``ScaleOut.note`` hold them. Each kind owns its one line (:func:`words`): the CLI, the tables,
the JSON's readable ``warnings`` / ``message`` and the RematWarning a report issues read it
from here, so no library module reaches up into :mod:`remat_kit.render` for a sentence.

Example:
  >>> note = Note("offload_moved_nothing", {"policy": "offload_dots"})
  >>> print(words(note))
  policy 'offload_dots' offloads to host but XLA moved 0 bytes there: nothing it names
  is a residual of this program
"""

from remat_kit.notes._note import HINT_KINDS, KINDS, Note, NoteKind, register
from remat_kit.notes._words import change_words, hint_words, label, shared_words, words

__all__ = [
    "HINT_KINDS",
    "KINDS",
    "Note",
    "NoteKind",
    "change_words",
    "hint_words",
    "label",
    "register",
    "shared_words",
    "words",
]
