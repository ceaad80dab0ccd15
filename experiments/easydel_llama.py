"""EasyDeL 0.3's Llama (NNX) as a remat-kit factory: ``--model experiments/easydel_llama.py:llama``.

EasyDeL pins jax 0.9.2 and needs PyTorch at import, so it lives in a venv of its own:

    python3 -m venv /tmp/edvenv && /tmp/edvenv/bin/pip install easydel==0.3.0 torch \\
        'jax[cuda12]==0.9.2' matplotlib && /tmp/edvenv/bin/pip install --no-deps -e .
    cd experiments && /tmp/edvenv/bin/remat-kit compare --model easydel_llama.py:llama \\
        --block easydel.modules.llama.modeling_llama:LlamaDecoderLayer --target h100 \\
        --batch 2 --seq 512 --optimizer sgd --mem-fraction 0.75 --jobs 1 \\
        --policies none,full,minimal,names:save=mlp_gate+mlp_up+mlp_down

Three of EasyDeL's habits, each handled here or by remat-kit:

- importing it sets ``XLA_PYTHON_CLIENT_MEM_FRACTION=1.0``: remat-kit names it ("set by easydel
  at import") and refuses the fraction (it leaves nothing for the CUDA context); give
  ``--mem-fraction``;
- its layers shard their activations by the mesh in context and place constants on the
  config's mesh: both must be a mesh of the devices the step is compiled for, so the factory
  takes ``target=`` and remat-kit hands it the target it compiles for;
- it tags its own tensors (``attn_query`` ... ``mlp_down``, ``residual``, ``layer_output``):
  remat-kit adds ours beside them (``--tags auto``), so ``minimal`` and a policy in EasyDeL's
  names both work, and ``--block`` on ``LlamaDecoderLayer`` applies the policy (EasyDeL calls
  its layers with keyword arrays: ``rk.remat`` passes them through the checkpoint).

The shape is small (width 256, 4 layers) so that it compiles in seconds; give ``layers=``.
"""

import easydel as ed
import jax.numpy as jnp
from flax import nnx

AXES = ("dp", "fsdp", "ep", "tp", "sp")  # EasyDeL's mesh axes, all of size 1 but dp


class InMesh(nnx.Module):
    """The model, run inside the mesh of the device the step compiles for; logits out."""

    def __init__(self, model, mesh):
        self.model, self.mesh = model, mesh

    def __call__(self, tokens):
        with self.mesh:
            return self.model(input_ids=tokens).logits


#: Llama 3 8B's shapes (``llama8b``); ``llama`` is a small one that compiles in seconds.
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
)
SMALL = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

#: EasyDeL's own remat option (``gradient_checkpointing``) for our policies, for the bare
#: compiles of ``experiments/library_models.py``: (EasyDeL's policy, its names to save).
OWN_REMAT = {
    "none": ("", None),
    "full": ("nothing_saveable", None),
    "dots_no_batch": ("dots_with_no_batch_dims_saveable", None),
    "minimal": (
        "save_only_these_names",
        ["attn_query", "attn_key", "attn_value", "attn_output", "mlp_gate", "mlp_up", "mlp_down"],
    ),
}


def _model(shape, target, layers, dtype, own_remat=("", None)):
    mesh = target.mesh(AXES, (target.devices, 1, 1, 1, 1))
    remat, names = own_remat
    config = ed.LlamaConfig(num_hidden_layers=layers, **shape)
    if remat:
        config.gradient_checkpointing = remat
        config.gradient_checkpointing_targets = names
    config.set_model_mesh(mesh)
    model = ed.LlamaForCausalLM(config=config, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0))
    return InMesh(model, mesh)


def llama(policy, target, layers=4):
    """EasyDeL's LlamaForCausalLM, small, f32; ``policy`` is applied by ``--block``;
    ``target`` is the one the step is compiled for (``--target``, ``--gpus``)."""
    return _model(SMALL, target, layers, jnp.float32)


def llama8b(policy, target, layers=4):
    """EasyDeL's LlamaForCausalLM at Llama 3 8B's shapes, bf16, ``layers`` of its 32."""
    return _model(LLAMA3_8B, target, layers, jnp.bfloat16)


def llama8b_own(policy, target, layers=4):
    """``llama8b`` with EasyDeL's own remat option for ``policy`` (``OWN_REMAT``) instead
    of ``--block``. EasyDeL wraps its layer class for good with the first policy it is
    given: build one policy per process."""
    return _model(LLAMA3_8B, target, layers, jnp.bfloat16, OWN_REMAT[policy.spec])
