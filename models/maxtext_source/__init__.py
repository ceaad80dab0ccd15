"""MaxText configs as a model source: MaxText's own model, train step, optimizer and mesh.

``--maxtext "model_name=llama2-7b ici_fsdp_parallelism=8"`` (or a YAML path first, as
MaxText's own command line takes it: ``"my.yml base_num_decoder_layers=4"``) is read by
MaxText's own ``pyconfig`` and built into MaxText's own ``train_step`` exactly as its AOT
compiler (``maxtext.trainers.pre_train.train_compile``) builds it: the abstract train state
of its NNX model and optimizer, the batch, the shardings of its logical axis rules, over a
mesh of the target's compile-only GPUs laid out by its ``ici_*``/``dcn_*`` parallelism keys.
The programs are the ones MaxText compiles (``tests/test_maxtext.py`` checks it to the byte).

What the command line owns is not taken from the config: the batch (``--batch`` is the global
batch: ``per_device_batch_size`` = batch / GPUs), the sequence (``--seq`` is
``max_target_length``) and the policy (``--policy``): a config that sets them is refused,
naming the flag. A policy reaches MaxText the way a MaxText user sets it (:func:`config_lines`):
MaxText's own ``remat_policy`` values (``maxtext:remat_policy=save_qkv_proj``), ``full``, and
any save/offload-by-name policy whose names are MaxText's per-tensor ``custom`` keys (the
lines ``plan`` prints); anything else (a dot policy) is handed to the decoder's
``get_remat_policy`` while the step is traced, and said so. MaxText wraps every layer in
``jax.checkpoint`` and has no setting without one: ``none`` (the baseline) is its step traced
with that checkpoint left out.

MaxText is an optional dependency (``pip install 'remat-kit[maxtext]'``): this module imports
it only when a MaxText source is built.

Example:
  >>> MaxTextSpec("model_name=llama2-7b base_num_decoder_layers=2").name
  'maxtext model_name=llama2-7b base_num_decoder_layers=2'
  >>> config_lines(rk.policy("offload", offload=["decoder_layer_input"], save=["context"]))
  ('remat_policy: custom', 'decoder_layer_input: offload', 'context: device')
"""

from remat_kit_models.maxtext import MaxTextSpec
from remat_kit_models.maxtext_lines import config_lines
from remat_kit_models.maxtext_source._mesh import OnHost, cluster_mesh
from remat_kit_models.maxtext_source._source import MaxTextSource, resolve
from remat_kit_models.maxtext_source._trace import PRNG_IMPL

__all__ = [
    "PRNG_IMPL",
    "MaxTextSource",
    "MaxTextSpec",
    "OnHost",
    "cluster_mesh",
    "config_lines",
    "resolve",
]
