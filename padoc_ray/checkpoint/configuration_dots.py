"""dots.ocr's configuration classes, shipped as remote code beside a tiny dots-format checkpoint.

:mod:`padoc_ray.checkpoint.tiny_dots` copies this file into the folder it builds; ``config.json``'s
``auto_map`` names it, and ``AutoConfig.from_pretrained(dir, trust_remote_code=True)`` loads it from there
(vLLM's config registry has no ``dots_ocr`` entry, so the real dots.ocr checkpoint ships its own
``configuration_dots.py`` too). It therefore imports only ``transformers``.

It holds what vLLM's ``DotsOCRForCausalLM`` and its Qwen2-VL-style processor read: the Qwen2 decoder's
fields (:class:`DotsOCRConfig` *is* a ``Qwen2Config``; vLLM checks the class by its name), the image and
video token ids, and the dots ViT's shape (:class:`DotsVisionConfig`). No model code: vLLM has its own.
"""

from __future__ import annotations

from transformers import PretrainedConfig, Qwen2Config


class DotsVisionConfig(PretrainedConfig):
    """dots' ViT: 14-pixel patches (one frame), RMSNorm blocks with a fused ``qkv`` and a SwiGLU MLP
    (``fc1``/``fc3`` -> ``fc2``), 2D rotary positions, and a merger of 2x2 patches into one token of
    ``hidden_size`` (the decoder's width). The defaults are dots.ocr's (1536 x 42)."""

    model_type = "dots_vit"

    def __init__(self, embed_dim=1536, hidden_size=1536, intermediate_size=4224, num_hidden_layers=42,
                 num_attention_heads=12, num_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=1,
                 rms_norm_eps=1e-5, use_bias=False, attn_implementation="flash_attention_2", initializer_range=0.02,
                 init_merger_std=0.02, is_causal=False, post_norm=True, gradient_checkpointing=False, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_channels = num_channels
        self.patch_size = patch_size
        self.spatial_merge_size = spatial_merge_size
        self.temporal_patch_size = temporal_patch_size
        self.rms_norm_eps = rms_norm_eps
        self.use_bias = use_bias
        self.attn_implementation = attn_implementation
        self.initializer_range = initializer_range
        self.init_merger_std = init_merger_std
        self.is_causal = is_causal
        self.post_norm = post_norm
        self.gradient_checkpointing = gradient_checkpointing


class DotsOCRConfig(Qwen2Config):
    """The Qwen2 decoder's config plus ``vision_config`` (:class:`DotsVisionConfig`) and the ids the
    processor expands (``image_token_id``: ``<|imgpad|>``) or keeps apart (``video_token_id``)."""

    model_type = "dots_ocr"
    sub_configs = {"vision_config": DotsVisionConfig}

    def __init__(self, image_token_id=151665, video_token_id=151656, vision_config=None, **kwargs):
        super().__init__(**kwargs)
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        if isinstance(vision_config, PretrainedConfig):
            self.vision_config = vision_config
        else:
            self.vision_config = DotsVisionConfig(**(vision_config or {}))
