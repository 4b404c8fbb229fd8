"""InternVL-Chat's configuration classes, shipped as remote code beside a tiny HPD-format checkpoint.

:mod:`padoc_ray.checkpoint.tiny_hpd` copies this file into the folder it builds; ``config.json``'s
``auto_map`` names it, and ``AutoConfig.from_pretrained(dir, trust_remote_code=True)`` (what vLLM does
for ``model_type: internvl_chat``) loads it from there. It therefore imports only ``transformers``.

It holds what vLLM's ``InternVLChatModel`` and its InternVL processor read: the InternViT tower's
shape (:class:`InternVisionConfig`), the decoder's config (``llm_config``, any model type
``AutoConfig`` knows; vLLM exposes it as ``text_config``) and the image rule (tile size, pixel-shuffle
ratio, dynamic tiling, thumbnail). Fields it does not know are kept as attributes (HPD's
``fork_token_id`` / ``child_token_id``). No model code: vLLM has its own InternVL implementation.
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig


class InternVisionConfig(PretrainedConfig):
    """InternViT: a ViT with a class token, learned positions, LayerScale (``ls1``/``ls2``) and a
    fused ``qkv`` projection. The defaults are InternViT-300M's."""

    model_type = "intern_vit_6b"

    def __init__(self, num_channels=3, patch_size=14, image_size=448, qkv_bias=True, hidden_size=1024,
                 num_attention_heads=16, intermediate_size=4096, qk_normalization=False, num_hidden_layers=24,
                 use_flash_attn=False, hidden_act="gelu", norm_type="layer_norm", layer_norm_eps=1e-6,
                 dropout=0.0, drop_path_rate=0.0, attention_dropout=0.0, initializer_range=0.02,
                 initializer_factor=0.1, **kwargs):
        super().__init__(**kwargs)
        self.num_channels = num_channels
        self.patch_size = patch_size
        self.image_size = image_size
        self.qkv_bias = qkv_bias
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.qk_normalization = qk_normalization
        self.num_hidden_layers = num_hidden_layers
        self.use_flash_attn = use_flash_attn
        self.hidden_act = hidden_act
        self.norm_type = norm_type
        self.layer_norm_eps = layer_norm_eps
        self.dropout = dropout
        self.drop_path_rate = drop_path_rate
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.initializer_factor = initializer_factor


class InternVLChatConfig(PretrainedConfig):
    """The vision tower, the decoder (``llm_config``) and InternVL's image rule, in one config."""

    model_type = "internvl_chat"
    sub_configs = {"vision_config": InternVisionConfig, "llm_config": AutoConfig}

    def __init__(self, vision_config=None, llm_config=None, use_backbone_lora=0, use_llm_lora=0,
                 select_layer=-1, force_image_size=None, downsample_ratio=0.5, template=None,
                 dynamic_image_size=False, use_thumbnail=False, ps_version="v1", min_dynamic_patch=1,
                 max_dynamic_patch=6, **kwargs):
        super().__init__(**kwargs)
        if isinstance(vision_config, PretrainedConfig):
            self.vision_config = vision_config
        else:
            self.vision_config = InternVisionConfig(**(vision_config or {}))
        if isinstance(llm_config, PretrainedConfig):
            self.llm_config = llm_config
        else:
            llm = dict(llm_config or {})
            self.llm_config = AutoConfig.for_model(llm.pop("model_type", "qwen3"), **llm)
        self.use_backbone_lora = use_backbone_lora
        self.use_llm_lora = use_llm_lora
        self.select_layer = select_layer
        self.force_image_size = force_image_size
        self.downsample_ratio = downsample_ratio
        self.template = template
        self.dynamic_image_size = dynamic_image_size
        self.use_thumbnail = use_thumbnail
        self.ps_version = ps_version
        self.min_dynamic_patch = min_dynamic_patch
        self.max_dynamic_patch = max_dynamic_patch
