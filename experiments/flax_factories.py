"""flax's own examples as remat-kit factories (``experiments/flax_examples.py``): lm1b's
TransformerLM (linen; training, so dropout is on) and gemma's NNX Transformer at Gemma 2B's
widths. ``$REMAT_KIT_FLAX_EXAMPLES`` names a flax checkout's ``examples`` folder."""

import os
import sys
import types

EXAMPLES = os.environ.get("REMAT_KIT_FLAX_EXAMPLES", "flax/examples")
for sub in ("lm1b", "gemma"):
    sys.path.insert(0, os.path.join(EXAMPLES, sub))
# gemma's params.py imports orbax to load checkpoints, which building the model never does.
orbax = sys.modules.setdefault("orbax", types.ModuleType("orbax"))
orbax.checkpoint = sys.modules.setdefault("orbax.checkpoint", types.ModuleType("orbax.checkpoint"))

import modules as gemma_modules  # noqa: E402
import transformer as gemma_transformer  # noqa: E402
import transformer_cfg  # noqa: E402
from flax import nnx  # noqa: E402

import models as lm1b_models  # noqa: E402

__all__ = ["LM1B", "gemma", "gemma_modules", "lm1b", "lm1b_models"]

#: lm1b's widths (its README's big model), 6 layers.
LM1B = dict(
    vocab_size=32000, output_vocab_size=32000, emb_dim=1024, num_heads=16, num_layers=6,
    qkv_dim=1024, mlp_dim=4096, max_len=2048,
)  # fmt: skip


def lm1b(policy, layers=6):
    """lm1b's TransformerLM, training (dropout 0.1): its policy goes in through --block."""
    del policy
    return lm1b_models.TransformerLM(
        lm1b_models.TransformerConfig(**{**LM1B, "num_layers": layers}, deterministic=False)
    )


def gemma(policy, layers=4):
    """gemma's NNX Transformer at Gemma 2B's widths, ``layers`` deep (policy via --block)."""
    del policy
    cfg = transformer_cfg.TransformerConfig.gemma_2b(
        num_layers=layers, attention_types=(transformer_cfg.AttentionType.GLOBAL,) * layers
    )
    return gemma_transformer.Transformer(cfg, rngs=nnx.Rngs(0))
