"""What is live at the peak of a compiled program, and when: XLA's buffer assignment, read.

``rk.memory_report`` says how many bytes a step needs; this subpackage says which buffers
they are. The program is compiled for the target (deviceless for a GPU) with XLA's debug
dump switched on for that one compile; the dump's buffer assignment, live ranges and
optimized HLO are read, and every byte at the peak is put in one category, layer and
(for activations) checkpoint name. The categories add up to ``peak_bytes``, the same
figure ``rk.memory_report`` gives for the same program.

One concern per module, the data flowing one way:

- ``_types``: categories, Phase, PeakBuffer, PeakReport, PeakDiff;
- ``_dump``: the compile with XLA's dump switched on, and the dump's files;
- ``_parsers``: buffer assignment, live ranges and HLO text (through
  :func:`remat_kit.xla.read_hlo`), read strictly;
- ``_tags``: checkpoint tags from the jaxpr, module paths, layer names;
- ``_phases``: forward / backward / optimizer spans of the schedule;
- ``_attribute``: live values, the timeline, and what each buffer at the peak is;
- ``_compare``: the difference of two reports;
- ``_series``: live bytes at every position, by category;
- ``_trace``: those bytes beside the predicted kernel timeline (``inspect --trace``);
- ``_api``: ``inspect`` and ``inspect_step``.

Tables and the timeline plot live in ``remat_kit.render`` (``peak_table``,
``plot_timeline``); the ``remat-kit inspect`` command in ``remat_kit.cli._inspect``.

Example:
  >>> import jax, jax.numpy as jnp, remat_kit as rk
  >>> x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
  >>> r = rk.inspect(lambda a: (a @ a) @ a, x, target="h100")
  >>> sum(r.by_category.values()) == r.peak_bytes
  True
"""

from remat_kit.errors import InspectError
from remat_kit.peak._api import check_target, inspect, inspect_step
from remat_kit.peak._compare import diff
from remat_kit.peak._profile import Section, live_sections
from remat_kit.peak._series import HOST, LiveSeries
from remat_kit.peak._trace import StepTrace, step_trace
from remat_kit.peak._types import (
    CATEGORIES,
    FRAGMENTATION,
    GRADIENT,
    INPUT,
    OPTIMIZER_STATE,
    PARAMETER,
    RECOMPUTE,
    SAVED_ACTIVATION,
    TEMPORARY,
    TRAIN_STEP_CATEGORIES,
    PeakBuffer,
    PeakDiff,
    PeakReport,
    Phase,
)

__all__ = [
    "CATEGORIES",
    "FRAGMENTATION",
    "GRADIENT",
    "HOST",
    "INPUT",
    "OPTIMIZER_STATE",
    "PARAMETER",
    "RECOMPUTE",
    "SAVED_ACTIVATION",
    "TEMPORARY",
    "TRAIN_STEP_CATEGORIES",
    "InspectError",
    "LiveSeries",
    "PeakBuffer",
    "PeakDiff",
    "PeakReport",
    "Phase",
    "Section",
    "StepTrace",
    "check_target",
    "diff",
    "inspect",
    "inspect_step",
    "live_sections",
    "step_trace",
]
