"""What an HLO op is, for costing: which launch nothing, which are collectives (and of which
kind), matrix products, cuBLAS and cuDNN calls, custom calls that launch nothing, slicing reads
and ops that compute nothing.

:mod:`remat_kit.xla._kernels` passes over what launches nothing; :mod:`remat_kit.xla._cost`
and :mod:`remat_kit.xla._traffic` read the rest.

Example:
  >>> "bitcast" in _FREE, _COLLECTIVES["all-gather-start"], "dot" in _DOTS
  (True, 'all-gather', True)
"""

from __future__ import annotations

# Ops that launch nothing: names, views, control flow (walked into), the second half of a pair.
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "copy-done",
        "fusion-done",
        "async-done",
        "async-update",
        "all-gather-done",
        "all-reduce-done",
        "reduce-scatter-done",
        "all-to-all-done",
        "collective-permute-done",
        "send-done",
        "recv-done",
        "domain",
        "get-dimension-size",
        "iota",
    }
)
_COLLECTIVES = {
    "all-gather": "all-gather",
    "all-gather-start": "all-gather",
    "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "reduce-scatter-start": "reduce-scatter",
    "all-to-all": "all-to-all",
    "all-to-all-start": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
    "ragged-all-to-all": "all-to-all",
}
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
_ATTENTION_FWD = "__cudnn$fmhaSoftmax"
# Custom calls that reserve memory or mark values, launching nothing.
_NO_KERNEL = frozenset(
    {
        "AllocateBuffer",
        "MoveToHost",
        "MoveToDevice",
        "annotate_device_placement",
        # libtpu's continuation-fusion markers (the transfer is the all-gather beside them)
        "AsyncCollectiveStart",
        "AsyncCollectiveDone",
    }
)
# Ops that read a window of their first operand (a slice of a stack costs the slice).
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})

# Ops that move or name data without computing on it.
_NO_ARITHMETIC = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",
        "broadcast",
        "reshape",
        "transpose",
        "copy",
        "tuple",
        "get-tuple-element",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "concatenate",
        "pad",
        "iota",
        "gather",
        "convert",
    }
)

# Matrix products. ``ragged-dot`` is a grouped GEMM (``jax.lax.ragged_dot``: MoE experts); XLA's
# GPU compiler of jax 0.10 rewrites it into a dense dot over all groups before it runs (E times
# the FLOPs, and those dense dots are what is priced then); where it survives as one kernel it
# costs its own FLOPs (:func:`remat_kit.xla._cost._ragged_dot_flops`).
_DOTS = ("dot", "convolution", "ragged-dot")
