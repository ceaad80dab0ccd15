"""DeepMind's gemma 3 (``gemma`` 3.3, Flax linen) as a remat-kit factory:
``--model experiments/gemma_model.py:gemma --block gemma.gm.nn._modules:Block``.

pip's resolution of gemma's dependencies (kauldron, grain, orbax) did not finish in a session;
its model code needs only some of them (kauldron's typing imports TensorFlow), so it lives in a
venv of its own, installed without dependencies plus what the import asks for:

    python3 -m venv /tmp/gemvenv && /tmp/gemvenv/bin/pip install -e . && \
        /tmp/gemvenv/bin/pip install --no-deps gemma==3.3.0 kauldron==1.4.2 etils einops \
        jaxtyping treescope wadler_lindig typeguard clu && \
        /tmp/gemvenv/bin/pip install tensorflow-cpu lark immutabledict sentencepiece tqdm \
        ml_collections 'etils[edc,enp,epath,epy,etree]' importlib_resources zipp fsspec
    /tmp/gemvenv/bin/remat-kit compare --model experiments/gemma_model.py:gemma \
        --block gemma.gm.nn._modules:Block --target h100 --batch 1 --seq 2048 \
        --optimizer sgd --precision bf16 --policies none,full,dots_no_batch

Gemma 3 4B's widths (2560 wide, MLP 10240, 8 heads of 256 over 4 KV heads, vocabulary 262144,
five sliding-window layers to one global, QK norms), text only, with ``layers`` of its 34
layers so that a compile takes seconds. Its ``Transformer.__call__`` is ``nn.jit``'ed and it
has no remat option: ``--block`` patches its ``Block``.
"""

from gemma.gm.nn import _config, _modules, _transformer

LOCAL, GLOBAL = _modules.AttentionType.LOCAL_SLIDING, _modules.AttentionType.GLOBAL


def gemma(policy, layers=6):
    """gemma 3 4B's text model, ``layers`` deep; ``policy`` is applied by ``--block``.

    The config is ``gm.nn.Gemma3_4B.config`` written out: that class's module imports
    gemma's checkpoint code, which needs a kauldron older than the one pip resolves.
    """
    config = _config.TransformerConfig(
        final_logit_softcap=None,
        num_embed=262_144,
        embed_dim=2560,
        hidden_dim=2560 * 8 // 2,
        num_heads=8,
        head_dim=256,
        num_kv_heads=4,
        use_post_attn_norm=True,
        use_post_ffw_norm=True,
        use_qk_norm=True,
        attention_types=_config.make_attention_layers_types(
            (LOCAL,) * 5 + (GLOBAL,), num_layers=layers
        ),
        query_pre_attn_norm=_config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
        attn_logits_soft_cap=None,
        sliding_window_size=1024,
        transpose_gating_einsum=True,
        local_base_frequency=10_000,
        global_base_frequency=1_000_000,
        global_scale_factor=8.0,
        vision_encoder=None,
    )
    return _transformer.Transformer(config=config, tokens="batch.tokens")
