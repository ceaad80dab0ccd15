"""Model requests and the kinds of source they name: the one door from a request to a source.

A model request is a small frozen value of one kind, a *spec*: :class:`FactorySpec` (a Flax
model a function of the user's builds), :class:`StepSpec` (a train step of the user's own), or
a spec a plugin brings. Each kind of spec is a :class:`SourceKind`: its spec type and the
function that turns a spec into a :class:`~remat_kit.sources.StepSource`. :func:`resolve` is
the only place a request becomes a source; nothing downstream asks which kind it holds.

A kind brings its command-line options (:class:`Option`: the flag, how its text is read, its
help, the spec field it fills; pip's option objects are the model) and its kinds of note
(``rk.notes.NoteKind``): the CLI builds its model flags, its refusals and its listings from
:func:`kinds`, and a note of the kind is worded by the kind's own words.

remat_kit knows its two kinds. Any other package adds kinds as a plugin, with one entry point
per kind in the group ``remat_kit.sources`` naming a :class:`SourceKind` (Python's entry
points, as pytest finds its plugins). The presets package registers its kinds this way
(``pyproject.toml``); remat_kit never imports it::

    [project.entry-points."remat_kit.sources"]
    preset = "remat_kit_models.source:PRESET"

This module starts no jax (``remat-kit --help`` reads the kinds' options): what a kind
resolves to is imported when a spec is resolved, and a plugin's kind module should import its
heavy code as lazily.

Example:
  >>> src = resolve(FactorySpec("tests/data/factories.py:untagged"))
  >>> src.spec, sorted(kinds())[:2]
  ('tests/data/factories.py:untagged', ['factory', 'hf'])
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.notes import NoteKind, register

if TYPE_CHECKING:  # imported where a spec is resolved: they start jax
    from remat_kit.sources._own_step import OwnStepSource
    from remat_kit.sources._protocol import StepSource
    from remat_kit.sources._source import ModelSource

__all__ = [
    "ENTRY_POINTS",
    "LAYERS",
    "MODEL",
    "OPTION_TYPES",
    "SHARD",
    "TRAIN_FIELDS",
    "TRAIN_OPTIONS",
    "FactorySpec",
    "ModelSpec",
    "Option",
    "SourceKind",
    "StepSpec",
    "kind_named",
    "kind_of",
    "kinds",
    "resolve",
]

#: The entry-point group a plugin registers its kinds of source in.
ENTRY_POINTS = "remat_kit.sources"

#: Train-config fields a kind may leave to the model's own code (a user's step has its own
#: optimizer, accumulation and precision): :attr:`SourceKind.trains` names those it honours.
TRAIN_FIELDS = frozenset({"optimizer", "accum", "precision"})


#: How an option's text is read (:attr:`Option.type`), besides a function ``text -> value``:
#: ``text`` as typed; ``name`` stripped and lower-cased (``--attention XLA``); ``positive_int``,
#: ``non_negative_int``, ``float``; ``fraction`` a number in [0, 1); ``precision`` a regime
#: of ``rk.train.PRECISIONS``; ``shard`` a mesh plan (``fsdp:8``); ``words`` one or more words
#: kept as one string (a config's words, ``a=1 b=2``); ``switch`` no value: given or not.
OPTION_TYPES = (
    "text",
    "name",
    "positive_int",
    "non_negative_int",
    "float",
    "fraction",
    "precision",
    "shard",
    "words",
    "switch",
)


@dataclasses.dataclass(frozen=True)
class Option:
    """A command-line option a kind of source takes: its flag, how its text is read, its help
    and the spec field it fills (pip's option objects are the model).

    A flag several kinds take (``--layers``, ``--shard``) is one flag on the command line:
    the first kind of :func:`kinds` that lists it declares it (its help, type and default),
    and each kind fills its own field with it.

    Attributes:
      flag: as typed, ``--kv-heads``.
      field: the spec field it fills (the model's name for the option of ``names_by``); for a
        ``train`` option, the train-config field it sets.
      help: the line ``--help`` shows.
      type: how its text is read: one of :data:`OPTION_TYPES`, or a function ``text -> value``
        that raises ValueError for a bad one.
      default: its value when not given (what ``--help`` states).
      metavar: how its value is shown in ``--help`` (None: the flag's name in capitals).
      choices: the values it takes, or None.
      group: the ``--help`` group it is listed in (``model``, ``training``, ``target and
        mesh``).
      key: the option fills one ``(key, value)`` pair of ``field``, a tuple of pairs (a
        preset's ``overrides``), or None: it fills ``field``.
      const: what a ``switch`` fills its field with when given.
      train: it sets the train config, not the spec (:data:`TRAIN_OPTIONS`): a kind takes it
        where it trains ``field``.
      params: the library parameters (``BadValue.param``) a value of this flag sets:
        ``n_layers`` for ``--layers``. The CLI names the flag in front of such an error.
      what: for an option that names the model, what a name given in it is, in the line that
        asks for one model.

    Example:
      >>> LAYERS.dest, LAYERS.field
      ('layers', 'layers')
    """

    flag: str
    field: str
    help: str
    type: str | Callable[[str], Any] = "text"
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    group: str = "model"
    key: str | None = None
    const: Any = True
    train: bool = False
    params: tuple[str, ...] = ()
    what: str | None = None

    def __post_init__(self) -> None:
        if not self.flag.startswith("--"):
            raise BadValue(f"option {self.flag!r}: a flag starts with --", param="flag")
        if isinstance(self.type, str) and self.type not in OPTION_TYPES:
            raise unknown("option type", self.type, OPTION_TYPES, param="type")
        object.__setattr__(self, "params", tuple(self.params))

    @property
    def dest(self) -> str:
        """The name its value is parsed into: ``--kv-heads`` -> ``kv_heads``."""
        return self.flag.removeprefix("--").replace("-", "_")


#: The model's name: a factory's ``file.py:NAME`` (and, for the presets' kind, a preset's;
#: the first kind that lists it, a factory, declares its help).
MODEL = Option(
    "--model",
    "model",
    "preset name (remat-kit models), or a factory path/file.py:NAME or "
    "package.module:NAME called as NAME(policy) -> Flax module (docs/your-model.md)",
    params=("model",),
    what="a preset, path/file.py:NAME or package.module:NAME",
)

#: The depth to build (a factory's ``layers=``; a preset's ``n_layers`` override).
LAYERS = Option(
    "--layers", "layers", "override: number of layers", type="positive_int", params=("n_layers",)
)

#: The copy of ``remat_kit.sharding``'s examples ``--shard``'s help shows (checked equal by
#: tests/test_help.py; sharding starts jax).
SHARD_EXAMPLES = "e.g. dp:8, fsdp:8, tp:8, cp:8, ep:8, fsdp:4,tp:2, fsdp:2,cp:4, fsdp:2,ep:4"

#: A mesh plan over the target's devices.
SHARD = Option(
    "--shard",
    "shard",
    f"sharding over --gpus devices: {SHARD_EXAMPLES} (dp/fsdp split the batch, cp the "
    "sequence, tp the heads and MLP, ep the experts of an MoE model and the batch); "
    "figures are per GPU",
    type="shard",
    group="target and mesh",
    params=("shard",),
)

#: The train config's options: a kind takes those of the fields it trains (where its options
#: do not place them, after them).
TRAIN_OPTIONS = (
    Option(
        "--optimizer",
        "optimizer",
        "adamw, adam, sgd, sgd_momentum, ...",
        type="name",
        default="adamw",
        group="training",
        train=True,
        params=("optimizer",),
    ),
    Option(
        "--accum",
        "accum",
        "gradient accumulation",
        type="positive_int",
        default=1,
        group="training",
        train=True,
        params=("accum",),
    ),
    Option(
        "--precision",
        "precision",
        "mixed (default: f32 master weights, gradients and optimizer state, bf16 compute; "
        "LoRA keeps bf16 base weights) | bf16 (everything bf16) | bf16-f32-moments (bf16 "
        "weights, f32 optimizer state) | f32",
        type="precision",
        group="training",
        train=True,
        params=("precision",),
    ),
    Option(
        "--param-dtype",
        "precision",
        "weights' dtype, the older form of --precision: f32 = mixed, bf16 = bf16",
        type="name",
        group="training",
        train=True,
        params=("param_dtype",),
    ),
    Option(
        "--dtype",
        "precision",
        "compute dtype (bf16, f32), over --precision's",
        type="name",
        group="training",
        train=True,
        params=("dtype",),
    ),
)


class ModelSpec(Protocol):
    """A request for one model: a frozen dataclass, one field of which names the model.

    Attributes:
      name: the model's name in titles and tables.
    """

    @property
    def name(self) -> str: ...


def _anything(value: str) -> bool:
    del value
    return True


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """One kind of model source: the spec that asks for one and how it becomes a source.

    Attributes:
      name: the kind's name (``"factory"``, ``"preset"`` ...), its entry point's name.
      spec: the spec's frozen dataclass; its fields are every option the kind takes.
      resolve: ``spec -> StepSource``; raises BadValue for a spec it cannot serve (an
        unknown preset, a file that does not load), before anything is traced.
      names_by: the spec field that names the model (``"model"``, ``"step"`` ...), one
        without a default. Kinds named by the same field tell their names apart with
        ``claims``.
      claims: whether a name given in ``names_by`` is one of this kind's (a factory's has a
        colon, ``file.py:NAME``; a preset's has none).
      fallback: the kind takes a name it claims only where no other kind claims it: a
        plugin's kind that claims ``toy-small`` wins over the presets, which claim every name
        without a colon, and one that claims ``toy:...`` over factories.
      trains: the train-config fields (of :data:`TRAIN_FIELDS`) its steps honour; a request
        that sets another is refused.
      catalogue: the models the kind knows by name, ``[(name, config)]`` (presets), or None.
      options: its command-line options (:class:`Option`), in the order its refusals name
        them: the option of ``names_by`` and one per spec field it is given by, and the
        :data:`TRAIN_OPTIONS` of the fields it trains where it places them (the others are
        added after them).
      notes: the kinds of note its sources return (``rk.notes.NoteKind``), registered with
        the kind.

    Raises:
      BadValue: ``names_by`` is not a field of the spec without a default, ``trains``
        names a field outside :data:`TRAIN_FIELDS`, an option fills no field of the spec,
        or a train option a field the kind does not train.
    """

    name: str
    spec: type
    resolve: Callable[[Any], StepSource]
    names_by: str
    claims: Callable[[str], bool] = _anything
    fallback: bool = False
    trains: frozenset[str] = TRAIN_FIELDS
    catalogue: Callable[[], Sequence[tuple[str, Any]]] | None = None
    options: tuple[Option, ...] = ()
    notes: tuple[NoteKind, ...] = ()

    def __post_init__(self) -> None:
        field = {f.name: f for f in dataclasses.fields(self.spec)}.get(self.names_by)
        if field is None or field.default is not dataclasses.MISSING:
            raise BadValue(
                f"kind {self.name!r}: names_by={self.names_by!r} must be a field of "
                f"{self.spec.__name__} without a default (its fields: {', '.join(self.fields)})",
                param="names_by",
            )
        object.__setattr__(self, "trains", frozenset(self.trains))
        if not self.trains <= TRAIN_FIELDS:
            raise BadValue(
                f"kind {self.name!r}: trains={sorted(self.trains)} must be among "
                f"{sorted(TRAIN_FIELDS)}",
                param="trains",
            )
        self._check_options()
        for kind in self.notes:
            register(kind)  # its notes are made and worded wherever the kind is loaded
        object.__setattr__(self, "notes", tuple(self.notes))

    def _check_options(self) -> None:
        options = list(self.options)
        for option in options:
            if not isinstance(option, Option):
                raise BadType(
                    f"kind {self.name!r}: options holds a {type(option).__name__}, not an "
                    "rk.sources.Option",
                    param="options",
                )
            wrong = (
                option.field not in self.trains if option.train else option.field not in self.fields
            )
            if wrong:
                what = "trains no" if option.train else "has no field"
                raise BadValue(
                    f"kind {self.name!r}: option {option.flag} fills {option.field!r}, and the "
                    f"kind {what} {option.field!r} (its fields: {', '.join(self.fields)})",
                    param="options",
                )
        placed = {o.flag for o in options}
        options += [o for o in TRAIN_OPTIONS if o.field in self.trains and o.flag not in placed]
        object.__setattr__(self, "options", tuple(options))

    @property
    def fields(self) -> tuple[str, ...]:
        """The spec's fields, the model's name first: every option this kind takes."""
        rest = [f.name for f in dataclasses.fields(self.spec) if f.name != self.names_by]
        return (self.names_by, *rest)


@dataclasses.dataclass(frozen=True)
class FactorySpec:
    """A Flax model a factory of the user's builds (``rk.sources.from_factory``).

    Attributes:
      model: ``path/file.py:NAME`` or ``package.module:NAME``, called as ``NAME(policy)``.
      block: ``module:Class`` of a block to rematerialize by patching, or None.
      tags: the tag rules (``rk.tagging.rules``); ``"none"``: the model's own tags only.
      layers: the depth to build, for a factory that takes ``layers=`` (None: its own).
      shard: a data-parallel mesh plan (``"fsdp:8"``), or None.

    Example:
      >>> FactorySpec("tests/data/factories.py:deep", layers=4).name
      'tests/data/factories.py:deep'
    """

    model: str
    block: str | None = None
    tags: str = "auto"
    layers: int | None = None
    shard: str | None = None

    @property
    def name(self) -> str:
        """The factory's location."""
        return self.model


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """A train step of the user's own, ``file.py:NAME`` (``rk.sources.from_step``): its model,
    optimizer, precision, accumulation and layout are its own.

    Example:
      >>> StepSpec("tests/data/own_steps.py:dense").name
      'tests/data/own_steps.py:dense'
    """

    step: str

    @property
    def name(self) -> str:
        """The step's location."""
        return self.step


def _resolve_factory(spec: FactorySpec) -> ModelSource:
    if spec.layers is None:
        return _loaded(spec.model, spec.block, spec.tags, spec.shard)
    deeper = _loaded_at(spec.model, spec.block, spec.tags, spec.shard, spec.layers)
    if deeper is None:
        raise BadValue(
            f"the factory {spec.model} takes no layers= argument, so it builds one depth: "
            "leave its layers as they are, or give it a layers parameter",
            param="n_layers",
        )
    return deeper


# One source per process and request: what a source traces once (its tags, its layer kinds)
# is kept for every command and search that asks for it again.
@functools.cache
def _loaded(model: str, block: str | None, tags: str, shard: str | None) -> ModelSource:
    from remat_kit.sources._source import from_factory

    return from_factory(model, block=block, tags=None if tags == "none" else tags, shard=shard)


@functools.cache
def _loaded_at(
    model: str, block: str | None, tags: str, shard: str | None, layers: int
) -> ModelSource | None:
    return _loaded(model, block, tags, shard).at_depth(layers, label=False)


@functools.cache
def _resolve_step(spec: StepSpec) -> OwnStepSource:
    from remat_kit.sources._own_step import from_step

    return from_step(spec.step)


_BLOCK = Option(
    "--block",
    "block",
    "with a factory: the block class to rematerialize by patching it (models with no "
    "remat hook), e.g. transformers.models.llama.modeling_flax_llama:FlaxLlamaDecoderLayer",
    metavar="MODULE:CLASS",
    params=("block",),
)
_TAGS = Option(
    "--tags",
    "tags",
    "with a factory: how its tensors are named: auto (default: a model that tags "
    "itself keeps its names, with ours beside EasyDeL's and MaxText's; others get "
    "hf+gpt2+gemma names, else module paths) | hf | gpt2 | gemma | easydel | maxtext | "
    "paths (module paths only) | none (the model's own tags only); join sets with +",
    type="name",
    metavar="RULES",
    params=("tags",),
)
_STEP = Option(
    "--step",
    "step",
    "a train step of your own instead of ours: NAME(policy, config) -> (fn, args[, "
    "donate_argnums]) or rk.sources.OwnStep (docs/your-model.md, 'Your own train step')",
    metavar="FILE.py:NAME",
    params=("step",),
    what="a train step of your own, file.py:NAME",
)

_BUILT_IN = (
    SourceKind(
        "factory",
        FactorySpec,
        _resolve_factory,
        "model",
        claims=lambda name: ":" in name,
        options=(MODEL, _BLOCK, _TAGS, *TRAIN_OPTIONS, SHARD, LAYERS),
    ),
    SourceKind("step", StepSpec, _resolve_step, "step", trains=frozenset(), options=(_STEP,)),
)


@functools.cache
def kinds() -> Mapping[str, SourceKind]:
    """Every kind of source: remat_kit's own and those installed plugins register.

    Read once per process from the ``remat_kit.sources`` entry points (installing a plugin
    needs a new process; ``kinds.cache_clear()`` reads them again).

    Returns:
      Kind name -> :class:`SourceKind`.

    Raises:
      BadType: an entry point that names something other than a SourceKind.
      BadValue: two kinds with one name.

    Example:
      >>> kinds()["step"].fields
      ('step',)
    """
    found = {kind.name: kind for kind in _BUILT_IN}
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        kind = point.load()
        if not isinstance(kind, SourceKind):
            raise BadType(
                f"entry point {point.name} = {point.value!r} in {ENTRY_POINTS} names a "
                f"{type(kind).__name__}, not an rk.sources.SourceKind",
                param="kind",
            )
        if kind.name in found and found[kind.name] is not kind:
            raise BadValue(
                f"two kinds of source are named {kind.name!r} ({point.value} and another): "
                "uninstall one",
                param="kind",
            )
        found[kind.name] = kind
    return found


def kind_of(spec: Any) -> SourceKind:
    """The kind a spec is of.

    Args:
      spec: a spec (``FactorySpec``, ``StepSpec`` or a plugin's).

    Returns:
      Its :class:`SourceKind`.

    Raises:
      BadType: a value that is no kind's spec (naming the spec types there are).

    Example:
      >>> kind_of(StepSpec("own.py:step")).name
      'step'
    """
    for kind in kinds().values():
        if type(spec) is kind.spec:
            return kind
    specs = ", ".join(sorted(k.spec.__name__ for k in kinds().values()))
    raise BadType(
        f"{spec!r} is not a model spec: give one of {specs} (rk.sources.kinds())", param="spec"
    )


def kind_named(field: str, name: str) -> SourceKind:
    """The kind whose models ``field`` names and that claims ``name``.

    Args:
      field: the spec field given (``"model"``, ``"step"`` ...).
      name: the name given in it.

    Returns:
      The one kind that claims it.

    Raises:
      UnknownName: no kind is named by ``field``.
      BadValue: no kind, or more than one, claims ``name``.

    Example:
      >>> kind_named("model", "tests/data/factories.py:deep").name
      'factory'
    """
    by_field = [k for k in kinds().values() if k.names_by == field]
    if not by_field:
        raise unknown("model field", field, sorted({k.names_by for k in kinds().values()}))
    claiming = [k for k in by_field if k.claims(name)]
    if len(claiming) > 1:
        claiming = [k for k in claiming if not k.fallback]
    if len(claiming) != 1:
        which = ", ".join(k.name for k in claiming or by_field)
        raise BadValue(
            f"{field}={name!r} is claimed by {len(claiming)} kinds of source ({which}): "
            + ("uninstall one of them" if claiming else "give a name one of them takes"),
            param=field,
        )
    return claiming[0]


def resolve(spec: Any) -> StepSource:
    """The source a spec asks for: its kind's ``resolve``.

    Args:
      spec: a spec of an installed kind (``FactorySpec``, ``StepSpec``, a preset's ...).

    Returns:
      The :class:`~remat_kit.sources.StepSource`.

    Raises:
      BadType: not a spec of any installed kind.
      BadValue: what the kind refuses (an unknown preset, a file that does not load ...).

    Example:
      >>> resolve(FactorySpec("tests/data/factories.py:deep", layers=4)).n_layers()
      4
    """
    return kind_of(spec).resolve(spec)
