"""The price table, its overrides and cost per token (remat_kit/targets/_prices.py)."""

import dataclasses
import datetime
import json
import re
from pathlib import Path

import pytest

from remat_kit.errors import BadType, BadValue, UnknownName
from remat_kit.targets import (
    ALIASES,
    GPU_FACTS,
    PRICE_TABLE_DATE,
    PRICES,
    Price,
    cost_per_million_tokens,
    load_prices,
    parse_prices,
    price_for,
    target,
    target_names,
)

TODAY = datetime.date(2026, 11, 24)


def _is_iso_date(text: str) -> bool:
    try:
        return datetime.date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


# --- the shipped table -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRICES))
def test_table_keys_are_canonical_gpu_names(name):
    assert name in target_names()
    assert name in GPU_FACTS  # a GPU, not "cpu"/"local"
    assert target(name).name == name


@pytest.mark.parametrize("name", sorted(PRICES))
def test_table_entries_name_provider_source_and_date(name):
    p = PRICES[name]
    assert isinstance(p, Price)
    assert p.provider.strip()
    assert re.fullmatch(r"https?://\S+", p.source), p.source
    assert p.date == "undated" or _is_iso_date(p.date), p.date
    assert 0.1 < p.usd_per_gpu_hour < 20  # dollars per GPU-hour, not per 8-GPU instance
    assert p.note.strip()  # which product, read where


def _recorded_prices() -> dict[str, dict]:
    """Each GPU's price as the recorded runs that docs/ quote priced it: the ``cost`` of
    results/advise_llama3-8b_b32_s4096.json's rows and of results/batch_vs_remat.json."""
    results = Path(__file__).resolve().parents[1] / "results"
    found = {}

    def walk(value):
        if isinstance(value, dict):
            price = value.get("price")
            if isinstance(price, dict) and "usd_per_gpu_hour" in price and "target" in value:
                found.setdefault(value["target"], []).append(price)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for name in ("advise_llama3-8b_b32_s4096.json", "batch_vs_remat.json"):
        walk(json.loads((results / name).read_text()))
    return found


_RECORDED = _recorded_prices()


@pytest.mark.parametrize("name", sorted(_RECORDED))
def test_the_table_prices_each_gpu_as_the_recorded_runs_docs_quote_did(name):
    """A price changed in a table changes dollar figures docs/ shows: the runs are made
    again with it (issue 58 mutant _prices.py:133 of seed 108, a100-40gb's 1.99 -> 2.99)."""
    from remat_kit.targets._prices import TPU_PRICES

    assert {json.dumps(p, sort_keys=True) for p in _RECORDED[name]} == {
        json.dumps({**PRICES, **TPU_PRICES}[name].to_dict(), sort_keys=True)
    }


def test_table_date_is_the_newest_entry():
    dated = [p.date for p in PRICES.values() if p.date != "undated"]
    assert max(dated) == PRICE_TABLE_DATE
    assert _is_iso_date(PRICE_TABLE_DATE)


def test_table_is_read_only():
    with pytest.raises(TypeError):
        PRICES["l4"] = Price(1.0, "x", "https://x", "undated")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRICES["b200"].usd_per_gpu_hour = 0.01  # type: ignore[misc]


def test_table_orders_the_cards_sensibly():
    # Same provider and date tier: a B200 costs more than an H200, an H200 more than an
    # H100, an H100 more than an A100 80GB, and a 4090 least.
    usd = {k: v.usd_per_gpu_hour for k, v in PRICES.items()}
    assert usd["b200"] > usd["h200"] > usd["h100-80gb"] > usd["a100-80gb"] > usd["rtx4090"]


@pytest.mark.parametrize("name", ["l4", "h20"])
def test_gpus_without_a_found_price_have_none(name):
    assert name in GPU_FACTS
    assert price_for(name) is None


# --- lookup ------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases_resolve_as_target_does(alias):
    canonical = target(alias).name
    assert price_for(alias) is PRICES.get(canonical)
    assert price_for(f"  {alias.upper()} ") is PRICES.get(canonical)
    over = parse_prices([f"{alias}=9.5"], today=TODAY)
    assert list(over) == [canonical]
    assert price_for(canonical, over).usd_per_gpu_hour == 9.5


def test_h100_alias_finds_the_sxm_price():
    assert price_for("h100") is PRICES["h100-80gb"]
    assert price_for("h100") is not PRICES["h100-pcie"]


@pytest.mark.parametrize("name", ["cpu", "local", "my-custom-gpu"])
def test_non_catalogue_names_have_no_price(name):
    assert price_for(name) is None


def test_override_wins_and_only_for_its_gpu():
    over = parse_prices(["h100=2.10"], today=TODAY)
    got = price_for("h100-80gb", over)
    assert got == Price(2.10, "user", "--price", "2026-11-24")
    assert price_for("a100-80gb", over) is PRICES["a100-80gb"]
    assert price_for("h100-80gb") is PRICES["h100-80gb"]  # the table itself is untouched


def test_override_prices_a_gpu_the_table_lacks():
    over = parse_prices(["l4=0.70"], today=TODAY)
    assert price_for("l4", over).usd_per_gpu_hour == 0.70
    assert price_for("l4") is None


def test_custom_target_priced_by_exact_name():
    over = {"my-gpu": Price(1.5, "user", "--price", "undated")}
    assert price_for("my-gpu", over).usd_per_gpu_hour == 1.5


def test_price_for_refuses_a_non_str():
    with pytest.raises(BadType, match="must be a str"):
        price_for(3)  # type: ignore[arg-type]


# --- cost --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usd", "gpus", "tok_s", "want"),
    [
        (2.00, 1, 1000.0, 0.5556),  # 2 / 3.6e6 tokens * 1e6
        (2.00, 8, 8000.0, 0.5556),  # 8 GPUs, 8x the tokens: same
        (3.60, 2, 1000.0, 2.0),  # 7.2 $/h / 3.6e6 tokens per hour * 1e6
        (1.00, 1, 3600.0, 0.0772),  # 1 $/h / 12.96e6 tokens * 1e6
    ],
)
def test_cost_per_million_tokens_by_hand(usd, gpus, tok_s, want):
    got = cost_per_million_tokens(Price(usd, "user", "--price", "undated"), gpus, tok_s)
    assert got == pytest.approx(want, abs=5e-5)


def test_cost_scales_with_gpus_and_inversely_with_throughput():
    p = Price(2.5, "user", "--price", "undated")
    base = cost_per_million_tokens(p, 1, 1000)
    assert cost_per_million_tokens(p, 4, 1000) == pytest.approx(4 * base)
    assert cost_per_million_tokens(p, 1, 4000) == pytest.approx(base / 4)


@pytest.mark.parametrize(
    ("gpus", "tok_s", "err", "match"),
    [
        (0, 1000, BadValue, "gpus must be a positive int"),
        (1.5, 1000, BadType, "gpus must be an int"),
        (True, 1000, BadType, "gpus must be an int"),
        (1, 0, BadValue, "tokens_per_second must be a positive"),
        (1, -5.0, BadValue, "tokens_per_second must be a positive"),
        (1, float("inf"), BadValue, "tokens_per_second must be a positive"),
        (1, "fast", BadValue, "tokens_per_second must be a positive"),
    ],
)
def test_cost_refuses_bad_counts(gpus, tok_s, err, match):
    with pytest.raises(err, match=match):
        cost_per_million_tokens(Price(2.0, "user", "--price", "undated"), gpus, tok_s)


def test_cost_refuses_a_bare_number_for_price():
    with pytest.raises(BadType, match="Price"):
        cost_per_million_tokens(2.0, 1, 1000)  # type: ignore[arg-type]


# --- --price strings ---------------------------------------------------------------------


def test_parse_prices_stamps_user_source_and_date():
    got = parse_prices(["h100=2.10", "a100-40gb=$1.25", " l40s = 0.9 "], today=TODAY)
    assert got == {
        "h100-80gb": Price(2.10, "user", "--price", "2026-11-24"),
        "a100-40gb": Price(1.25, "user", "--price", "2026-11-24"),
        "l40s": Price(0.9, "user", "--price", "2026-11-24"),
    }


def test_parse_prices_defaults_to_today():
    (p,) = parse_prices(["h200=3"]).values()
    assert p.date == datetime.date.today().isoformat()


def test_parse_prices_empty_is_empty():
    assert parse_prices([], today=TODAY) == {}


@pytest.mark.parametrize(
    ("items", "err", "match"),
    [
        (["h10=2"], UnknownName, r"unknown GPU 'h10'.*Known: a100-40gb, .*rtx4090"),
        (["cpu=1"], UnknownName, r"unknown GPU 'cpu'"),
        (["h100"], BadValue, r"price 'h100' has no '='.*NAME=USD_PER_GPU_HOUR"),
        (["=2"], BadValue, r"price '=2' has no GPU name"),
        (["h100=abc"], BadValue, r"price 'h100=abc'.*positive number.*got 'abc'"),
        (["h100="], BadValue, r"price 'h100='.*positive number"),
        (["h100=0"], BadValue, r"price 'h100=0'.*positive number.*got '0'"),
        (["h100=-1"], BadValue, r"price 'h100=-1'.*positive number"),
        (["h100=nan"], BadValue, r"positive number.*got 'nan'"),
        (["h100=inf"], BadValue, r"positive number.*got 'inf'"),
        (["h100=2", "h100-80gb=3"], BadValue, r"'h100-80gb' given twice"),
        ("h100=2", BadType, r"list of 'NAME=USD' strings"),
        ([2.1], BadType, r"'NAME=USD' str"),
    ],
)
def test_parse_prices_errors(items, err, match):
    with pytest.raises(err, match=match) as info:
        parse_prices(items, today=TODAY)
    assert info.value.param == "price"


def test_parse_prices_unknown_suggests_close_names():
    with pytest.raises(UnknownName) as info:
        parse_prices(["a10O=1"], today=TODAY)
    assert "a100-80gb" in info.value.close
    assert set(info.value.known) == set(GPU_FACTS)


# --- price files -------------------------------------------------------------------------


def _write(tmp_path, data) -> str:
    path = tmp_path / "prices.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_load_prices_numbers_and_objects(tmp_path):
    path = _write(
        tmp_path,
        {
            "h100": 2.1,
            "a100-80gb": {
                "usd_per_gpu_hour": 1.3,
                "provider": "CoreWeave",
                "source": "https://www.coreweave.com/pricing",
                "date": "2026-10-01",
                "note": "8x instance / 8",
            },
            "l4": {"usd_per_gpu_hour": 0.5, "date": "undated"},
        },
    )
    got = load_prices(path, today=TODAY)
    assert got == {
        "h100-80gb": Price(2.1, "user", path, "2026-11-24"),
        "a100-80gb": Price(
            1.3, "CoreWeave", "https://www.coreweave.com/pricing", "2026-10-01", "8x instance / 8"
        ),
        "l4": Price(0.5, "user", path, "undated"),
    }


def test_loaded_prices_override_the_table(tmp_path):
    over = load_prices(_write(tmp_path, {"b200": 5.0}), today=TODAY)
    assert price_for("b200", over).usd_per_gpu_hour == 5.0
    assert price_for("h200", over) is PRICES["h200"]


@pytest.mark.parametrize(
    ("data", "err", "match"),
    [
        ('{"h100": 2.1', BadValue, r"not valid JSON \(line 1, column \d+"),
        ("[1, 2]", BadValue, r"holds a list, not an object"),
        ({"h10": 2}, UnknownName, r"unknown GPU 'h10'"),
        ({"h100": 0}, BadValue, r"entry 'h100'.*positive number"),
        ({"h100": "cheap"}, BadValue, r"entry 'h100'.*positive number.*got 'cheap'"),
        ({"h100": True}, BadValue, r"entry 'h100'.*positive number.*got True"),
        ({"h100": None}, BadValue, r"entry 'h100'.*positive number"),
        ({"h100": {"usd": 2}}, BadValue, r"unknown field\(s\) 'usd'.*Valid: usd_per_gpu_hour"),
        ({"h100": {"provider": "x"}}, BadValue, r"usd_per_gpu_hour is missing"),
        ({"h100": {"usd_per_gpu_hour": 2, "date": "last week"}}, BadValue, r"ISO date"),
        ({"h100": {"usd_per_gpu_hour": 2, "provider": 7}}, BadValue, r"provider must be a str"),
        ({"h100": 2, "h100-80gb": 3}, BadValue, r"prices 'h100-80gb' twice"),
    ],
)
def test_load_prices_errors(tmp_path, data, err, match):
    with pytest.raises(err, match=match) as info:
        load_prices(_write(tmp_path, data), today=TODAY)
    assert info.value.param == "price_file"


def test_load_prices_missing_file(tmp_path):
    with pytest.raises(BadValue, match=r"price file .*nope\.json does not exist") as info:
        load_prices(tmp_path / "nope.json")
    assert info.value.param == "price_file"


# --- TPU prices ----------------------------------------------------------------------------


def test_tpu_price_rows_are_known_generations_from_google_cloud():
    from remat_kit.targets._prices import TPU_PRICE_TABLE_DATE, TPU_PRICES
    from remat_kit.targets._tpus import TPU_FACTS

    assert set(TPU_PRICES) == {"v4", "v5e", "v5p", "v6e"}  # v7x: no on-demand price found
    assert set(TPU_PRICES) <= set(TPU_FACTS)
    assert not set(TPU_PRICES) & set(PRICES)  # never mixed into the GPU table
    assert max(p.date for p in TPU_PRICES.values()) == TPU_PRICE_TABLE_DATE
    for name, p in TPU_PRICES.items():
        assert isinstance(p, Price), name
        assert p.provider == "Google Cloud"
        assert p.source == "https://cloud.google.com/tpu/pricing"
        assert _is_iso_date(p.date), p.date
        assert 0.5 < p.usd_per_gpu_hour < 10  # per chip-hour, not per slice
        assert "us-central" in p.note and "https://" in p.note  # region and transcription


@pytest.mark.parametrize("generation", ["v4", "v5e", "v5p", "v6e"])
def test_a_tpu_price_per_chip_is_each_transcribed_slice_price_over_its_chips(generation):
    # Each row's note transcribes the slices' hourly prices off the catalog: the per-chip
    # rate times a slice's chips (stated, or the tpu-v5litepod-N / tpu-v6e-N count) is it.
    from remat_kit.targets._prices import TPU_PRICES

    price = TPU_PRICES[generation]
    rows = re.findall(r"tpu-([\w]+)-(\d+)(?: \((\d+) chips\))? \$([\d,.]+)/h", price.note)
    assert len(rows) >= 2, price.note
    for kind, suffix, chips, usd in rows:
        n = int(chips) if chips else int(suffix)  # v5e and v6e are named by their chips
        assert price.usd_per_gpu_hour * n == pytest.approx(float(usd.replace(",", ""))), kind


def test_tpu_prices_order_and_read_only():
    from remat_kit.targets._prices import TPU_PRICES

    usd = {k: v.usd_per_gpu_hour for k, v in TPU_PRICES.items()}
    assert usd["v5p"] > usd["v4"] > usd["v6e"] > usd["v5e"]
    with pytest.raises(TypeError):
        TPU_PRICES["v7x"] = Price(1.0, "x", "https://x", "undated")  # type: ignore[index]


def test_tpu_price_costs_a_slice_per_chip():
    from remat_kit.targets._prices import TPU_PRICES

    # a v5p-128 slice is 64 chips: $4.20 x 64 an hour
    usd = cost_per_million_tokens(TPU_PRICES["v5p"], gpus=64, tokens_per_second=1e6 / 3600)
    assert round(usd, 2) == round(4.20 * 64, 2)


@pytest.mark.parametrize(
    ("target", "devices", "billed"),
    # TPU7x: two JAX devices a chip (Cloud TPU bills the chip); other TPUs and GPUs: one.
    [("tpu7x", 8, 4), ("tpu7x", 2, 1), ("v5p", 4, 4), ("v6e", 16, 16), ("h100", 8, 8)],
)
def test_a_price_is_billed_per_chip_on_a_tpu_and_per_gpu_on_a_gpu(target, devices, billed):
    from types import SimpleNamespace

    from remat_kit.search import cost_of

    advice = SimpleNamespace(target=target, devices=devices, tokens_per_second=5000.0, fits=True)
    price = Price(3.0, "user", "--price", "undated")
    cost = cost_of(advice, prices={target: price, "h100-80gb": price})
    # By hand: 3 $ per chip- or GPU-hour, `billed` of them, 5000 tokens/s for an hour.
    assert cost.usd_per_million_tokens == pytest.approx(3.0 * billed / (5000 * 3600) * 1e6)
