"""TPU slices as users name them: ``v5p-64``, ``v5e-16``, ``v6e:8x16``, and libtpu's topology.

A Cloud TPU slice is named by its generation and a count (``v5p-64``): TensorCores for the
generations with two per chip (v4, v5p, TPU7x), chips for those with one (v5e, v6e). MaxText's
``compile_topology`` and Cloud TPU's accelerator types use these names. libtpu builds a slice
from a *topology* (``v5:2x4x4``: the chips' grid) plus three settings that say how the chips
form devices and hosts; the names below turn into those the way MaxText's table
(``maxtext/utils/accelerator_to_spec_map.py``) writes them, which the tests compare name by
name:

- **chips per device**: v4 and v5p run their chip's two TensorCores as one JAX device
  ("megacore", libtpu's ``chip_config_name="megacore"``); TPU7x presents each core as a device;
  v5e and v6e have one core per chip.
- **grid**: v5e and v6e are 2D tori of at most 16x16 chips; v4, v5p and TPU7x are 3D. A count
  that is a power of two gets the balanced grid Cloud TPU sells (2D: ``a x b`` with ``b`` equal
  to ``a`` or ``2a``; 3D: from ``2x2x1``, each doubling doubles the smallest side). Other counts
  Cloud TPU sells (``v5p-6144``) take the grid MaxText's table gives them where MaxText is
  installed; any grid can be named as libtpu names it (``v5p:12x16x16``).
- **wraparound** (libtpu's ``wrap``): a 3D slice whose every side is a multiple of 4 is a
  torus; a 2D slice wraps along a side of 16 chips (a full pod's edge).
- **chips per host** as libtpu groups them: 2x2x1 (one chip alone: 1x1x1). Cloud TPU's own hosts
  hold 4 chips, 8 for a one-host v5e/v6e slice of 8 (Cloud TPU's v5e and v6e pages): that is
  :attr:`Slice.hosts`.

Example:
  >>> s = parse_slice("v5p-64")
  >>> s.generation, s.chips, s.topology, s.devices, s.hosts
  ('v5p', 32, 'v5:2x4x4', 32, 8)
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Mapping

from remat_kit.errors import BadValue, unknown
from remat_kit.targets._tpus import TPU_FACTS

__all__ = [
    "GENERATIONS",
    "TPU_ALIASES",
    "Layout",
    "Slice",
    "device_word_of",
    "generation_of",
    "is_slice_name",
    "parse_slice",
    "slice_of",
]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one TPU generation's chips form a slice.

    Attributes:
      name: the generation as Cloud TPU names its slices (``"v5p"``).
      prefix: libtpu's name of it in a topology (``"v5"`` for v5p, as MaxText writes it).
      dims: the torus's dimensions (2 or 3).
      cores_per_chip: TensorCores on one chip; the slice's count counts them when 2.
      devices_per_chip: JAX devices per chip (1 under megacore, 2 for TPU7x's cores).
      chip_config: libtpu's ``chip_config_name``.
      max_chips: the largest slice Cloud TPU sells (a pod), in chips.
      one_host_chips: the most chips one host holds in a one-host slice.
    """

    name: str
    prefix: str
    dims: int
    cores_per_chip: int
    devices_per_chip: int
    chip_config: str
    max_chips: int
    one_host_chips: int


def _layout(name: str, facts: Mapping[str, object]) -> Layout:
    return Layout(
        name=name,
        prefix=str(facts["topology_prefix"]),
        dims=int(facts["torus_dims"]),
        cores_per_chip=int(facts["tensorcores_per_chip"]),
        devices_per_chip=int(facts["devices_per_chip"]),
        chip_config=str(facts["chip_config_name"]),
        max_chips=int(facts["pod_chips"]),
        one_host_chips=int(facts["chips_per_host"]),
    )


#: The generations, from their cited facts (:data:`remat_kit.targets._tpus.TPU_FACTS`).
GENERATIONS: Mapping[str, Layout] = types.MappingProxyType(
    {name: _layout(name, facts) for name, facts in TPU_FACTS.items()}
)

#: Other spellings users and tools write: Cloud TPU's accelerator types (``v5litepod-16``),
#: the product names, and libtpu's own prefixes.
TPU_ALIASES: Mapping[str, str] = types.MappingProxyType(
    {
        "v5litepod": "v5e",
        "v5lite": "v5e",
        "v5": "v5p",
        "trillium": "v6e",
        "v7x": "tpu7x",
        "ironwood": "tpu7x",
        "tpu-v4": "v4",
        "tpu-v5e": "v5e",
        "tpu-v5p": "v5p",
        "tpu-v6e": "v6e",
    }
)


@dataclasses.dataclass(frozen=True)
class Slice:
    """One TPU slice (or several alike, joined over the data-centre network).

    Attributes:
      generation: a key of :data:`GENERATIONS`.
      grid: the chips' grid, one side per torus dimension (``(2, 4, 4)``).
      slices: how many such slices (MaxText's ``num_slices``; DCN between them).

    Example:
      >>> s = Slice("v6e", (8, 16))
      >>> s.name, s.wrap, s.chips_per_host_bounds
      ('v6e-128', (False, True, False), (2, 2, 1))
    """

    generation: str
    grid: tuple[int, ...]
    slices: int = 1

    def __post_init__(self) -> None:
        layout = generation_of(self.generation)
        object.__setattr__(self, "generation", layout.name)
        grid = tuple(int(g) for g in self.grid)
        if len(grid) != layout.dims or min(grid) < 1:
            raise BadValue(
                f"a {layout.name} slice is a {layout.dims}D grid of chips, got "
                f"{'x'.join(map(str, grid))}",
                param="target",
            )
        if math.prod(grid) > layout.max_chips:
            raise BadValue(
                f"{layout.name} slices hold at most {layout.max_chips} chips (a pod), got "
                f"{math.prod(grid)}: join slices over the data-centre network instead "
                "(slices=N)",
                param="target",
            )
        if isinstance(self.slices, bool) or not isinstance(self.slices, int) or self.slices < 1:
            raise BadValue(f"slices must be a positive int, got {self.slices!r}", param="slices")
        object.__setattr__(self, "grid", grid)

    @property
    def layout(self) -> Layout:
        """The generation's :class:`Layout`."""
        return GENERATIONS[self.generation]

    @property
    def chips(self) -> int:
        """Chips in one slice."""
        return math.prod(self.grid)

    @property
    def devices(self) -> int:
        """JAX devices over all slices."""
        return self.chips * self.layout.devices_per_chip * self.slices

    @property
    def name(self) -> str:
        """Cloud TPU's name of one slice (``v5p-64``: TensorCores or chips, as it counts)."""
        return f"{self.generation}-{self.chips * self.layout.cores_per_chip}"

    @property
    def topology(self) -> str:
        """libtpu's topology name (``v5:2x4x4``)."""
        return f"{self.layout.prefix}:{'x'.join(map(str, self.grid))}"

    @property
    def wrap(self) -> tuple[bool, bool, bool]:
        """Wraparound links per dimension, as libtpu takes them (three entries)."""
        if self.layout.dims == 3:
            torus = all(g % 4 == 0 for g in self.grid)
            return (torus, torus, torus)
        return (self.grid[0] == 16, self.grid[1] == 16, False)

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """How libtpu groups chips into hosts (a lone chip is a host of its own)."""
        return (1, 1, 1) if self.chips == 1 else (2, 2, 1)

    @property
    def hosts(self) -> int:
        """Cloud TPU's hosts (VMs) over all slices: 4 chips each, or all of a small slice."""
        one = self.chips <= self.layout.one_host_chips
        return (1 if one else -(-self.chips // 4)) * self.slices

    def topology_args(self) -> dict[str, object]:
        """The keyword arguments of ``jax.experimental.topologies.get_topology_desc``."""
        return {
            "topology_name": self.topology,
            "chip_config_name": self.layout.chip_config,
            "chips_per_host_bounds": self.chips_per_host_bounds,
            "num_slices": self.slices,
            "wrap": self.wrap,
        }


def generation_of(name: str) -> Layout:
    """The :class:`Layout` of a generation name or alias (``"v5litepod"`` is v5e).

    Raises:
      UnknownName: not a TPU generation.

    Example:
      >>> generation_of("trillium").name
      'v6e'
    """
    key = name.strip().lower()
    key = TPU_ALIASES.get(key, key)
    if key not in GENERATIONS:
        raise unknown("TPU generation", name, list(GENERATIONS), param="target")
    return GENERATIONS[key]


_COUNTED = re.compile(r"^([a-z0-9]+?)-(\d+)$")
_GRID = re.compile(r"^([a-z0-9]+?):(\d+(?:x\d+)*)$")


def is_slice_name(name: str) -> bool:
    """Whether ``name`` reads as a TPU slice (a known generation, bare, counted or gridded).

    Example:
      >>> is_slice_name("v5p-64"), is_slice_name("v6e:4x4"), is_slice_name("h100")
      (True, True, False)
    """
    return _generation_named(name) is not None


def device_word_of(name: str) -> str:
    """What one device of the target ``name`` is called in words, from its name alone: a TPU
    slice's ``"chip"`` (``"TensorCore"`` on TPU7x, two devices a chip), else ``"GPU"`` (what
    ``rk.Target.device_word`` says of the target built, without building it).

    Example:
      >>> device_word_of("v5p-64"), device_word_of("tpu7x"), device_word_of("h100")
      ('chip', 'TensorCore', 'GPU')
    """
    layout = _generation_named(name)
    if layout is None:
        return "GPU"
    return "chip" if layout.devices_per_chip == 1 else "TensorCore"


def _generation_named(name: str) -> Layout | None:
    # The generation a name reads as (bare, counted or gridded), None for any other name.
    key = name.strip().lower()
    m = _COUNTED.match(key) or _GRID.match(key)
    head = m.group(1) if m else key
    return GENERATIONS.get(TPU_ALIASES.get(head, head))


def parse_slice(name: str, chips: int | None = None, slices: int = 1) -> Slice:
    """A :class:`Slice` from a name: ``v5p-64``, ``v5litepod-16``, ``v6e:8x16``, or a bare
    generation with ``chips``.

    Args:
      name: a counted name (Cloud TPU's and MaxText's ``compile_topology``), a libtpu topology
        (``v5p:4x4x8``; ``v5:4x4x8`` as MaxText writes v5p), or a bare generation.
      chips: the chips of a bare generation's slice (its grid is the balanced one).
      slices: slices joined over the data-centre network.

    Raises:
      UnknownName: no such generation.
      BadValue: a count the generation cannot make (odd TensorCores, a count that is no power
        of two: the message names the grid form), or more chips than a pod.

    Example:
      >>> parse_slice("v6e-256").topology, parse_slice("v6e-256").wrap
      ('v6e:16x16', (True, True, False))
      >>> parse_slice("v5e", chips=8).name
      'v5e-8'
    """
    key = name.strip().lower()
    if m := _GRID.match(key):
        return Slice(generation_of(m.group(1)).name, tuple(map(int, m.group(2).split("x"))), slices)
    if m := _COUNTED.match(key):
        layout = generation_of(m.group(1))
        count = int(m.group(2))
        if count % layout.cores_per_chip:
            raise BadValue(
                f"{name!r} counts TensorCores, {layout.cores_per_chip} to a chip: use an even "
                f"count (e.g. {layout.name}-{2 * count})",
                param="target",
            )
        chips = count // layout.cores_per_chip
        if chips & (chips - 1) and (grid := _sold_grid(layout, count)) is not None:
            return Slice(layout.name, grid, slices)
        return Slice(layout.name, _grid(layout, chips, name), slices)
    layout = generation_of(key)
    if chips is None:
        raise BadValue(
            f"target {name!r} names a TPU generation, not a slice: name one as "
            f"{layout.name}-N (N {'TensorCores' if layout.cores_per_chip == 2 else 'chips'}) "
            f"or {layout.name}:{'x'.join(['A', 'B', 'C'][: layout.dims])}",
            param="target",
        )
    return Slice(layout.name, _grid(layout, chips, name), slices)


def slice_of(generation: str, devices: int, slices: int = 1) -> Slice:
    """The balanced slice of ``generation`` that holds ``devices`` JAX devices in all.

    Example:
      >>> slice_of("v5p", 8).name
      'v5p-16'
    """
    layout = generation_of(generation)
    per = layout.devices_per_chip * slices
    if devices % per:
        raise BadValue(
            f"{devices} devices do not make {slices} {layout.name} slice(s) of whole chips "
            f"({per} device(s) a chip over all slices)",
            param="devices",
        )
    return parse_slice(layout.name, chips=devices // per, slices=slices)


def _sold_grid(layout: Layout, count: int) -> tuple[int, ...] | None:
    # Cloud TPU sells grids for counts that are no power of two (v5p-6144 is 12x16x16, tpu7x-384
    # 4x4x12), one chosen grid each and no rule behind the choice: MaxText's table of them is
    # the one public list, so where MaxText is installed its names work as it reads them.
    try:
        from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics
    except ImportError:
        return None
    spec = UserFacingNameToSystemCharacteristics.get(f"{layout.name}-{count}")
    if spec is None or not spec.topology_name:
        return None
    return tuple(int(g) for g in spec.topology_name.split(":")[1].split("x"))


def _grid(layout: Layout, chips: int, name: str) -> tuple[int, ...]:
    if chips < 1 or chips & (chips - 1):
        form = "x".join(["A", "B", "C"][: layout.dims])
        raise BadValue(
            f"{name!r}: {chips} chips have no default {layout.dims}D grid (powers of two do); "
            f"name the grid as libtpu does: {layout.name}:{form}",
            param="target",
        )
    k = chips.bit_length() - 1
    if layout.dims == 2:
        return (2 ** (k // 2), 2 ** (k - k // 2))
    if chips < 4:
        return (1, 1, chips) if chips < 2 else (1, 2, 1)
    grid = [2, 2, 1]
    for _ in range(k - 2):
        i = grid.index(min(grid))
        grid[i] *= 2
        grid.sort()
    return tuple(grid)
