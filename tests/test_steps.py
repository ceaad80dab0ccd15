"""A source's steps measured and searched (remat_kit.sources._steps), with the compiles made by
hand: what ``measure``'s depth modes compile, and what a Workload keeps of its source."""

from __future__ import annotations

import dataclasses

import pytest

import remat_kit as rk
from helpers import memory_report
from remat_kit.sources import _steps as steps
from remat_kit.sources._source import ModelSource

UNTAGGED = "tests/data/factories.py:untagged"  # a small linen model: built, never compiled here
CONFIG = rk.TrainConfig(batch=2, seq=16)


@pytest.mark.parametrize(
    ("depth", "whole"),
    [
        ("estimate", False),  # the copies' figures whatever the verdict (a search's probe)
        ("auto", True),  # a verdict over the limit is compiled whole
        ("check", True),  # always both
    ],
)
def test_a_verdict_from_copies_over_the_limit_is_compiled_whole_except_for_an_estimate(
    monkeypatch, depth, whole
):
    h100 = rk.target("h100")
    over = 2 * h100.usable_bytes  # the copies say it does not fit: not a settled verdict
    copies = memory_report(peak_bytes=over)
    compiled = []

    def by_depth(source, pol, sch, t, config, compile_step):
        return copies, {"mode": "extrapolated"}

    def full_compile(fn, *args, **kw):
        compiled.append(kw["policy"])
        return memory_report(peak_bytes=over + 1)

    monkeypatch.setattr(steps, "by_depth", by_depth)
    monkeypatch.setattr(steps, "memory_report", full_compile)
    src = rk.sources.from_factory(UNTAGGED)
    # meta: nothing remembered on disk answers in place of these compiles
    got = steps.measure(src, "full", h100, CONFIG, warn=False, depth=depth, meta={"t": depth})
    assert len(compiled) == (1 if whole else 0)
    assert got.peak_bytes == (over + 1 if whole else over)
    assert got.meta["depth"]["mode"] == ("verified" if whole else "extrapolated")


class _TrainerRemats(ModelSource):
    remat_always = True  # as MaxText's trainer: no setting without a checkpoint


@pytest.mark.parametrize("always", [False, True])
def test_a_workload_keeps_whether_its_sources_trainer_always_remats(always):
    # plan never compiles `none` for a model whose trainer always checkpoints.
    src = rk.sources.from_factory(UNTAGGED)
    if always:
        src = _TrainerRemats(**{f.name: getattr(src, f.name) for f in dataclasses.fields(src)})
    assert src.remat_always is always
    assert rk.sources.workload(src, "h100", CONFIG).remat_always is always
