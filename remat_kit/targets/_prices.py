"""What an hour of each GPU costs: a dated table of on-demand prices the user can override.

Prices are on-demand list prices in US dollars per GPU-hour (no commitment, no spot), one
provider per GPU, each with the page it was read from and the date it was read. Where a
provider lists a multi-GPU instance, the table keeps its per-GPU rate (the instance price
divided by its GPU count; both providers used here list that rate themselves). Prices change
and differ several-fold between providers for the same card: they rank GPUs for one workload,
they do not quote a bill. A GPU with no findable price is left out (:func:`price_for` gives
None), never guessed.

The readings come from public transcriptions of the providers' own pricing pages, each named in
the entry's ``note``:

* RunPod Secure Cloud (RunPod-operated data centres, per-second billing):
  https://www.runpod.io/pricing
* Lambda on-demand instances: https://lambda.ai/instances, https://lambda.ai/pricing

Example:
  >>> p = price_for("h100")
  >>> p.provider, p.date
  ('RunPod (Secure Cloud)', '2026-11-09')
  >>> round(cost_per_million_tokens(p, gpus=8, tokens_per_second=20_000), 3)
  0.443
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import math
import numbers
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from remat_kit.errors import BadType, BadValue, unknown
from remat_kit.targets._catalogue import ALIASES, GPU_FACTS
from remat_kit.targets._slices import TPU_ALIASES
from remat_kit.targets._tpus import TPU_FACTS

__all__ = [
    "PRICES",
    "PRICE_CAVEAT",
    "PRICE_TABLE_DATE",
    "TPU_PRICES",
    "TPU_PRICE_TABLE_DATE",
    "Price",
    "billed_units",
    "cost_per_million_tokens",
    "load_prices",
    "parse_prices",
    "price_for",
]

#: What every rendering of these prices should say beside them.
PRICE_CAVEAT = (
    "On-demand list prices as read on the dates shown; prices change and differ between "
    "providers. Check each source, or give your own."
)

_UNDATED = "undated"


@dataclasses.dataclass(frozen=True)
class Price:
    """An on-demand price of one GPU for one hour, and where it came from.

    Attributes:
      usd_per_gpu_hour: US dollars per GPU per hour (an instance's price divided by its GPUs).
      provider: who charges it (``"RunPod (Secure Cloud)"``; ``"user"`` for a price given).
      source: where it was read: a web address, ``"--price"`` for a price given as
        ``name=usd``, or the path of a price file.
      date: the ISO date it was read (``"2026-09-25"``), or ``"undated"``.
      note: the product it is the price of, and how it was read.

    Example:
      >>> Price(2.1, "user", "--price", "2026-11-24").to_dict()["usd_per_gpu_hour"]
      2.1
    """

    usd_per_gpu_hour: float
    provider: str
    source: str
    date: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields of the price."""
        return dataclasses.asdict(self)


def _runpod(usd: float, date: str, note: str) -> Price:
    return Price(usd, "RunPod (Secure Cloud)", "https://www.runpod.io/pricing", date, note)


def _lambda(usd: float, source: str, date: str, note: str) -> Price:
    return Price(usd, "Lambda", source, date, note)


_DATARECEIPTS = (
    "read 2026-11-09 per https://raw.githubusercontent.com/datareceipts/data-receipts/"
    "main/109-gpu-pricing/vendors.json"
)
_SILYBENCH = (
    "read 2026-09-25 per https://raw.githubusercontent.com/tgarg01/silybench-data/"
    "main/derived/cost.json"
)
_EVANGELIST_RUNPOD = (
    "read 2026-10-07 per https://raw.githubusercontent.com/api-evangelist/runpod/"
    "refs/heads/main/plans/runpod-plans-pricing.yml (same price on 2026-09-25 per "
    "github.com/tgarg01/silybench-data)"
)
_EVANGELIST_LAMBDA = (
    "read 2026-09-20 per https://raw.githubusercontent.com/api-evangelist/lambda-labs/"
    "refs/heads/main/plans/lambda-labs-plans-pricing.yml"
)

#: On-demand $/GPU-hour per catalogue GPU (canonical names). l4 and h20: no dated on-demand
#: price found, so absent.
PRICES: Mapping[str, Price] = types.MappingProxyType(
    {
        "h100-80gb": _runpod(3.99, "2026-11-09", f"H100 SXM pod, 1 GPU; {_DATARECEIPTS}"),
        "h100-pcie": _runpod(2.89, "2026-11-09", f"H100 PCIe pod, 1 GPU; {_DATARECEIPTS}"),
        "a100-80gb": _runpod(1.79, "2026-11-09", f"A100 SXM 80GB pod, 1 GPU; {_DATARECEIPTS}"),
        "h200": _runpod(4.59, "2026-10-07", f"H200 pod, 1 GPU; {_EVANGELIST_RUNPOD}"),
        "b200": _runpod(6.79, "2026-10-07", f"B200 pod, 1 GPU; {_EVANGELIST_RUNPOD}"),
        "l40s": _runpod(1.09, "2026-09-25", f"L40S pod, 1 GPU; {_SILYBENCH}"),
        "rtx4090": _runpod(0.74, "2026-09-25", f"RTX 4090 pod, 1 GPU; {_SILYBENCH}"),
        "a100-40gb": _lambda(
            1.99,
            "https://lambda.ai/pricing",
            "2026-09-25",
            "1x A100 SXM 40GB instance; the 8x instance lists the same per-GPU rate; " + _SILYBENCH,
        ),
        "rtx-a6000": _lambda(
            1.09,
            "https://lambda.ai/instances",
            "2026-09-20",
            "4x A6000 instance, the per-GPU rate Lambda lists (instance price / 4); "
            + _EVANGELIST_LAMBDA,
        ),
    }
)


def _newest(table: Mapping[str, Price]) -> str:
    # One reading for both tables: a rule written twice can be wrong in the one a test does
    # not tell (the TPU rows share one date, so there min reads as max).
    return max(p.date for p in table.values() if p.date != _UNDATED)


#: The newest date in :data:`PRICES`.
PRICE_TABLE_DATE: str = _newest(PRICES)

# --- TPUs ----------------------------------------------------------------------------------
# Cloud TPU on-demand list prices, US dollars per chip-hour (a slice costs chips x the rate; the
# rate is the same at every slice size in the rows read), keyed by remat_kit.targets._tpus
# generation names. usd_per_gpu_hour holds the per-chip rate: the field is the per-accelerator
# hourly price. Provider: Google Cloud, page https://cloud.google.com/tpu/pricing. That page
# (its tables are drawn client-side) is not in the sources these were read from; the figures
# are Google's own list prices as transcribed from Google's Cloud Billing SKU catalog by
# SkyPilot's GCP catalog (its fetcher reads the billing API: skypilot-org/skypilot#4540), read
# 2026-11-29 at catalog commit 017e2502 (the commit's own date not recorded here). v6e's $2.70
# also matches what skypilot-org/skypilot#4218 (2024-10-30) read off the pricing page itself
# ("us-east1: 2.7, us-east5: 2.7"). No on-demand price was found for TPU7x (v7x): left out.
_SKYPILOT_GCP = (
    "read 2026-11-29 per https://github.com/skypilot-org/skypilot-catalog/blob/"
    "017e2502fb63c7a28757acd94002b2d6099d3e3d/catalogs/v7/gcp/vms.csv"
)


def _google(usd: float, note: str) -> Price:
    return Price(usd, "Google Cloud", "https://cloud.google.com/tpu/pricing", "2026-11-29", note)


#: On-demand $/chip-hour per TPU generation (keys of ``remat_kit.targets._tpus.TPU_FACTS``).
TPU_PRICES: Mapping[str, Price] = types.MappingProxyType(
    {
        "v5e": _google(
            1.20,
            "TPU v5e (v5litepod) on demand, us-central1 (us-central1-a): tpu-v5litepod-1 "
            "$1.20/h, tpu-v5litepod-8 $9.60/h, tpu-v5litepod-256 $307.20/h; " + _SKYPILOT_GCP,
        ),
        "v5p": _google(
            4.20,
            "TPU v5p on demand, us-central1 (us-central1-a): tpu-v5p-8 (4 chips) $16.80/h, "
            "tpu-v5p-12288 (6144 chips) $25,804.80/h; " + _SKYPILOT_GCP,
        ),
        "v6e": _google(
            2.70,
            "TPU v6e (Trillium) on demand, us-central1 (us-central1-b; the same in us-east1, "
            "us-east5): tpu-v6e-1 $2.70/h, tpu-v6e-256 $691.20/h; " + _SKYPILOT_GCP,
        ),
        "v4": _google(
            3.22,
            "TPU v4 on demand, us-central2 (us-central2-b, v4's only US zone): tpu-v4-4096 "
            "(2048 chips) $6,594.56/h, tpu-v4-6144 (3072 chips) $9,891.84/h; " + _SKYPILOT_GCP,
        ),
    }
)

#: The newest date in :data:`TPU_PRICES`.
TPU_PRICE_TABLE_DATE: str = _newest(TPU_PRICES)


def _key(name: str) -> str:
    # The normalization target() applies: case, surrounding space, aliases (a TPU's too).
    key = name.strip().lower()
    return TPU_ALIASES.get(key, ALIASES.get(key, key))


def _gpu_name(name: object, param: str) -> str:
    """The canonical catalogue GPU name for ``name``; UnknownName for anything else."""
    if not isinstance(name, str):
        raise BadType(f"GPU name must be a str, got {type(name).__name__}: {name!r}", param=param)
    key = _key(name)
    if key in GPU_FACTS or key in TPU_FACTS:
        return key
    matches = difflib.get_close_matches(key, [*GPU_FACTS, *ALIASES, *TPU_FACTS], n=6, cutoff=0.5)
    close = list(dict.fromkeys(ALIASES.get(m, m) for m in matches))[:3]
    raise unknown("GPU", name, GPU_FACTS, close=close, param=param)


def price_for(name: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of one hour of GPU ``name``: the user's if given, else the table's.

    Args:
      name: a target name or alias (``"h100"``, ``"h100-80gb"``); a name the catalogue does not
        know (a custom target) is looked up as given.
      overrides: prices that win over :data:`PRICES`, keyed by canonical name (what
        :func:`parse_prices` and :func:`load_prices` return).

    Returns:
      The :class:`Price`, or None where neither the overrides nor the table have one
      (``"l4"``, ``"cpu"``).

    Raises:
      BadType: ``name`` is not a str.

    Example:
      >>> price_for("a100").usd_per_gpu_hour
      1.79
      >>> price_for("h100", parse_prices(["h100=2.10"])).provider
      'user'
      >>> price_for("l4") is None
      True
    """
    if not isinstance(name, str):
        raise BadType(
            f"GPU name must be a str, got {type(name).__name__}: {name!r}", param="target"
        )
    key = _key(name)
    for table in (overrides or {}, PRICES, TPU_PRICES):
        if key in table:
            return table[key]
    return None


def _usd(value: object, what: str, valid: str, param: str) -> float:
    """``value`` as a positive finite number of dollars, or a BadValue naming ``what``."""
    number: float | None = None
    if isinstance(value, str):
        text = value.strip().removeprefix("$")
        try:
            number = float(text)
        except ValueError:
            number = None
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise BadValue(
            f"{what}: the price must be a positive number of US dollars per GPU-hour, "
            f"got {value!r}. {valid}",
            param=param,
        )
    return number


def _today(today: datetime.date | None) -> str:
    return (today or datetime.date.today()).isoformat()


_ITEM_FORM = "Give NAME=USD_PER_GPU_HOUR, e.g. 'h100=2.10'."


def parse_prices(items: Sequence[str], today: datetime.date | None = None) -> dict[str, Price]:
    """Prices given as ``name=usd`` strings (what ``--price h100=2.10`` collects).

    Args:
      items: ``"NAME=USD_PER_GPU_HOUR"`` strings; NAME is a GPU target name or alias, USD a
        positive number (a leading ``$`` is allowed).
      today: the date the prices are stamped with; default: today.

    Returns:
      A :class:`Price` per canonical GPU name, provider ``"user"``, source ``"--price"``.

    Raises:
      UnknownName: a NAME that is no GPU in the catalogue (the GPUs are listed).
      BadValue: an item without ``=``, a price that is not a positive number, or a GPU priced
        twice.
      BadType: ``items`` is a single str, or an item is not a str.

    Example:
      >>> parse_prices(["h100=2.10", "a100=$1.2"], today=datetime.date(2026, 11, 24))["a100-80gb"]
      Price(usd_per_gpu_hour=1.2, provider='user', source='--price', date='2026-11-24', note='')
    """
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise BadType(
            f"prices must be a list of 'NAME=USD' strings, got {type(items).__name__}: {items!r}",
            param="price",
        )
    date = _today(today)
    out: dict[str, Price] = {}
    given: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str):
            raise BadType(
                f"a price must be a 'NAME=USD' str, got {type(item).__name__}: {item!r}",
                param="price",
            )
        name, sep, value = item.partition("=")
        if not sep:
            raise BadValue(f"price {item!r} has no '='. {_ITEM_FORM}", param="price")
        if not name.strip():
            raise BadValue(f"price {item!r} has no GPU name. {_ITEM_FORM}", param="price")
        key = _gpu_name(name, "price")
        if key in given:
            raise BadValue(
                f"price for {key!r} given twice ({given[key]!r}, {item!r}); give it once",
                param="price",
            )
        usd = _usd(value, f"price {item!r}", _ITEM_FORM, "price")
        given[key] = item
        out[key] = Price(usd, "user", "--price", date)
    return out


_FILE_FIELDS = ("usd_per_gpu_hour", "provider", "source", "date", "note")
_FILE_FORM = (
    'A price file is a JSON object: {"h100": 2.1, "a100-80gb": {"usd_per_gpu_hour": 1.3, '
    '"provider": "...", "source": "...", "date": "YYYY-MM-DD"}}.'
)


def _file_date(value: object, where: str) -> str:
    if value == _UNDATED:
        return _UNDATED
    try:
        return datetime.date.fromisoformat(value).isoformat()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadValue(
            f"{where}: date must be an ISO date (YYYY-MM-DD) or 'undated', got {value!r}",
            param="price_file",
        ) from None


def _file_entry(name: str, entry: object, path: str, date: str) -> Price:
    where = f"price file {path}, entry {name!r}"
    if not isinstance(entry, dict):
        return Price(_usd(entry, where, _FILE_FORM, "price_file"), "user", path, date)
    extra = sorted(set(entry) - set(_FILE_FIELDS))
    if extra:
        raise BadValue(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))}. "
            f"Valid: {', '.join(_FILE_FIELDS)}",
            param="price_file",
        )
    if "usd_per_gpu_hour" not in entry:
        raise BadValue(f"{where}: usd_per_gpu_hour is missing. {_FILE_FORM}", param="price_file")
    for field in ("provider", "source", "note"):
        if field in entry and not isinstance(entry[field], str):
            raise BadValue(
                f"{where}: {field} must be a string, got {entry[field]!r}", param="price_file"
            )
    return Price(
        _usd(entry["usd_per_gpu_hour"], where, _FILE_FORM, "price_file"),
        entry.get("provider", "user"),
        entry.get("source", path),
        _file_date(entry["date"], where) if "date" in entry else date,
        entry.get("note", ""),
    )


def load_prices(
    path: str | os.PathLike[str], today: datetime.date | None = None
) -> dict[str, Price]:
    """Prices read from a JSON file (what ``--price FILE`` reads).

    The file is an object keyed by GPU name or alias; a value is a number (dollars per
    GPU-hour) or an object with ``usd_per_gpu_hour`` and optionally ``provider``, ``source``,
    ``date`` (ISO or ``"undated"``) and ``note``. What an entry leaves out is provider
    ``"user"``, source the file's path, and ``today``.

    Args:
      path: the JSON file.
      today: the date entries without one are stamped with; default: today.

    Returns:
      A :class:`Price` per canonical GPU name.

    Raises:
      BadValue: the file is missing or unreadable, not JSON, not an object, or an entry is
        malformed (a GPU priced twice through an alias included).
      UnknownName: a key that is no GPU in the catalogue.

    Example:
      >>> import pathlib, tempfile
      >>> f = pathlib.Path(tempfile.mkdtemp()) / "prices.json"
      >>> _ = f.write_text('{"h100": 2.1}')
      >>> load_prices(f)["h100-80gb"].usd_per_gpu_hour
      2.1
    """
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise BadValue(f"price file {shown} does not exist", param="price_file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadValue(f"price file {shown} cannot be read: {err}", param="price_file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadValue(
            f"price file {shown} is not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg}). {_FILE_FORM}",
            param="price_file",
        ) from None
    if not isinstance(data, dict):
        raise BadValue(
            f"price file {shown} holds a {type(data).__name__}, not an object. {_FILE_FORM}",
            param="price_file",
        )
    date = _today(today)
    out: dict[str, Price] = {}
    given: dict[str, str] = {}
    for name, entry in data.items():
        key = _gpu_name(name, "price_file")
        if key in given:
            raise BadValue(
                f"price file {shown} prices {key!r} twice ({given[key]!r}, {name!r})",
                param="price_file",
            )
        given[key] = name
        out[key] = _file_entry(name, entry, shown, date)
    return out


def billed_units(name: str, devices: int) -> int:
    """What a price of ``name`` is billed on for a step on ``devices`` of its JAX devices.

    A GPU's price is per GPU-hour, one device each. A TPU's is per chip-hour (Cloud TPU's
    pricing page bills chips), and a TPU7x chip is two JAX devices (``devices_per_chip`` in
    :data:`~remat_kit.targets.TPU_FACTS`): billed per device it would be charged twice.

    Args:
      name: a target name or alias (a TPU generation, ``"tpu7x"``).
      devices: the JAX devices the step runs on.

    Returns:
      The GPUs or chips billed (chips rounded up: a chip is rented whole).

    Example:
      >>> billed_units("h100", 4), billed_units("v5p", 4), billed_units("tpu7x", 8)
      (4, 4, 4)
    """
    facts = TPU_FACTS.get(_key(name)) if isinstance(name, str) else None
    per = int(facts["devices_per_chip"]) if facts is not None else 1
    return -(-devices // per)


def cost_per_million_tokens(price: Price, gpus: int, tokens_per_second: float) -> float:
    """US dollars to train on a million tokens at ``tokens_per_second`` on ``gpus`` GPUs.

    ``usd_per_gpu_hour * gpus / (tokens_per_second * 3600) * 1e6``.

    Args:
      price: the price of one GPU-hour.
      gpus: how many GPUs the step runs on (all of them billed).
      tokens_per_second: tokens trained per second by all ``gpus`` together.

    Returns:
      Dollars per million tokens.

    Raises:
      BadType: ``price`` is not a :class:`Price`, or ``gpus`` not an int.
      BadValue: ``gpus`` below 1, or ``tokens_per_second`` not a positive finite number.

    Example:
      >>> round(cost_per_million_tokens(Price(2.0, "user", "--price", "undated"), 1, 1000), 4)
      0.5556
    """
    if not isinstance(price, Price):
        raise BadType(
            f"price must be an rk Price, got {type(price).__name__}: {price!r}", param="price"
        )
    if isinstance(gpus, bool) or not isinstance(gpus, numbers.Integral):
        raise BadType(f"gpus must be an int, got {type(gpus).__name__}: {gpus!r}", param="gpus")
    if gpus < 1:
        raise BadValue(f"gpus must be a positive int, got {gpus}", param="gpus")
    if (
        isinstance(tokens_per_second, bool)
        or not isinstance(tokens_per_second, numbers.Real)
        or not math.isfinite(tokens_per_second)
        or tokens_per_second <= 0
    ):
        raise BadValue(
            f"tokens_per_second must be a positive finite number, got {tokens_per_second!r}",
            param="tokens_per_second",
        )
    return price.usd_per_gpu_hour * gpus / (tokens_per_second * 3600) * 1e6
