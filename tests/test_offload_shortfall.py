"""An offload XLA carries out only in part is said, with both figures (issue 26).

jax marks the residuals an offload policy names for host memory; XLA decides which copies
happen. A scanned stack moves every marked byte; unrolled layers (``--no-scan``) only part of
them, and the report must say so. The marked bytes are written out from SMALL's shapes.
"""

import pytest

from conftest import SMALL
from remat_kit.render.notes import words


def _marked_by_hand() -> int:
    """Bytes ``minimal_offloaded`` marks in SMALL: q, k, v, out, wi_0, wi_1 of every layer,
    bf16 (mlpwo is not needed by the backward pass: it is summed into the residual stream)."""
    o = dict(SMALL["overrides"])
    tokens = SMALL["batch"] * SMALL["seq"]
    kv_width = o["kv_heads"] * (o["width"] // o["heads"])
    features = o["width"] + 2 * kv_width + o["width"] + 2 * o["ff"]
    return o["layers"] * tokens * features * 2


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_a_partial_offload_is_said_with_both_figures(small, scan):
    r = small("minimal_offloaded", scan=scan)
    marked = _marked_by_hand()
    moved = r.host_temp_bytes or r.host_bytes
    notes = [n for n in r.notes if n.kind == "offload_shortfall"]
    if scan:
        assert moved == marked
        assert notes == []
    else:
        assert 0 < moved < marked
        assert [n.data for n in notes] == [{"moved_bytes": moved, "marked_bytes": marked}]
        said = f"offload moved {moved / 2**30:.2f} GiB to host of the {marked / 2**30:.2f} GiB"
        assert words(notes[0]).startswith(said)
        assert words(notes[0]) in r.warnings
