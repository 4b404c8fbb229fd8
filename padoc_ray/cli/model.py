"""``build-tiny-model`` and ``init-model``: make checkpoints (:mod:`padoc_ray.checkpoint`)."""

from __future__ import annotations

import argparse
import os

from padoc_ray.cli.common import add_command, die


def cmd_build_tiny_model(args) -> int:
    import time

    from padoc_ray.checkpoint.protocol_files import refuse_existing

    try:
        refuse_existing(args.out, args.force)  # before torch and transformers load (seconds)
    except FileExistsError as e:
        die(str(e))
    if args.family in ("hpd", "dots"):
        return _build_tiny_remote_code(args)
    from padoc_ray.checkpoint.tiny import TinyModelConfig, build_tiny_model

    t = time.perf_counter()
    try:
        cfg = TinyModelConfig(seed=args.seed, tie_word_embeddings=args.tie_word_embeddings)
        out = build_tiny_model(args.out, cfg=cfg, force=args.force, base=args.base)
    except FileExistsError as e:
        die(str(e))
    n = os.path.getsize(os.path.join(out, "model.safetensors"))
    what = "Qwen3-VL base (no protocol tokens)" if args.base else "PaDoc Qwen3-VL checkpoint"
    print(f"built tiny {what} in {out} ({n / 1e6:.1f} MB float32, {time.perf_counter() - t:.1f}s)")
    if args.base:
        print(f"make it a PaDoc checkpoint with: padoc-ray init-model --base {out} --out DIR")
    return 0


#: --family hpd / dots: (what is built, why --base does not apply, why --tie-word-embeddings does not)
_REMOTE_CODE_FAMILIES = {
    "hpd": ("HPD-Parsing-format (InternVL)", "an hpd checkpoint is HPD-Parsing's own InternVL format, with no base form",
            "HPD-Parsing's decoder has its own LM head (language_model.lm_head)"),
    "dots": ("dots.ocr-format (DotsOCRForCausalLM)", "a dots checkpoint is dots.ocr's own format, with no base form",
             "dots.ocr's Qwen2 decoder has its own LM head (lm_head)"),
}


def _build_tiny_remote_code(args) -> int:
    """--family hpd or dots: a checkpoint in that model's own format, with its remote-code config."""
    import time

    what, no_base, own_head = _REMOTE_CODE_FAMILIES[args.family]
    if args.base:
        die(f"--base applies to --family padoc only: it builds a plain Qwen3-VL base for `padoc-ray init-model`; "
            f"{no_base}")
    if args.tie_word_embeddings:
        die(f"--tie-word-embeddings applies to --family padoc only: {own_head}")
    t = time.perf_counter()
    try:
        if args.family == "hpd":
            from padoc_ray.checkpoint.tiny_hpd import TinyHpdConfig, build_tiny_hpd_model

            out = build_tiny_hpd_model(args.out, cfg=TinyHpdConfig(seed=args.seed), force=args.force)
        else:
            from padoc_ray.checkpoint.tiny_dots import TinyDotsConfig, build_tiny_dots_model

            out = build_tiny_dots_model(args.out, cfg=TinyDotsConfig(seed=args.seed), force=args.force)
    except FileExistsError as e:
        die(str(e))
    n = os.path.getsize(os.path.join(out, "model.safetensors"))
    print(f"built tiny {what} checkpoint in {out} ({n / 1e6:.1f} MB float32, "
          f"{time.perf_counter() - t:.1f}s); load it with trust_remote_code")
    return 0


# ---- init-model ---------------------------------------------------------------------------------
def cmd_init_model(args) -> int:
    import time

    from padoc_ray.checkpoint.init import InitModelError, VerifyError, init_model
    from padoc_ray.protocol import ProtocolError, ProtocolSpec
    from padoc_ray.cli.flags import from_args
    from padoc_ray.storage import StorageConfig

    t = time.perf_counter()
    try:
        spec = ProtocolSpec.load(args.spec) if args.spec else ProtocolSpec()
    except (ProtocolError, OSError) as e:
        die(f"--spec {args.spec}: {e}")
    try:
        s = init_model(args.base, args.out, spec=spec, force=args.force, verify=args.verify,
                       storage=from_args(StorageConfig, args))
    except (InitModelError, FileNotFoundError) as e:
        die(str(e))
    except VerifyError as e:
        die(f"{e}; nothing was written to {args.out}", code=1)
    first, last = s["new_token_ids"] or (None, None)
    print(f"PaDoc checkpoint in {s['out']}: +{s['added_tokens']} protocol tokens (ids {first}..{last}), vocabulary "
          f"{s['base_tokenizer_len']} -> {s['tokenizer_len']} tokens, embedding rows {s['vocab_rows'][0]} -> "
          f"{s['vocab_rows'][1]} ({'tied' if s['tie_word_embeddings'] else 'untied'} LM head, {s['dtype']}); "
          f"new rows = mean of the base token rows")
    if "verify" in s:
        v = s["verify"]
        print(f"verified in vLLM: engine up in {v['engine_start_s']}s, generated {len(v['free_tokens'])} tokens, "
              f"forced protocol region reproduced ({len(v['forced_tokens'])} tokens)")
    else:
        print("not verified in vLLM (--no-verify)")
    print(f"done in {time.perf_counter() - t:.1f}s")
    return 0



def register(sub) -> None:
    from padoc_ray.cli.flags import add_fields
    from padoc_ray.storage import StorageConfig

    b = add_command(sub, "build-tiny-model", help="build a tiny random-weight checkpoint (offline): PaDoc Qwen3-VL, "
                                                  "HPD-Parsing or dots.ocr format",
                       description="Build, offline and deterministically, a tiny random-weight float32 checkpoint for "
                                   "tests, demos and CPU benchmarks: its outputs are noise unless teacher-forced. "
                                   "--family padoc (default): a Qwen3-VL PaDoc checkpoint with tokenizer, processor "
                                   "configs, chat template and padoc_protocol.json; with --base, the same tiny "
                                   "Qwen3-VL without the protocol, which `padoc-ray init-model` turns into a PaDoc "
                                   "checkpoint. --family hpd: a checkpoint in HPD-Parsing's format (InternVL: "
                                   "InternViT, MLP projector, Qwen3 decoder; config.json with fork_token_id / "
                                   "child_token_id and its remote-code config; HPD's tokens and InternVL's chat "
                                   "template); --family dots: a checkpoint in dots.ocr's format (DotsOCRForCausalLM: "
                                   "dots ViT and a Qwen2 decoder; config.json with its remote-code config, dots' "
                                   "chat tokens and template, a Qwen2-VL image processor with a small pixel budget). "
                                   "Stock vLLM loads hpd and dots checkpoints with trust_remote_code.")
    b.add_argument("out", help="directory to write (must be empty or missing)")
    b.add_argument("--force", action="store_true", help="overwrite a non-empty OUT")
    b.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    b.add_argument("--family", choices=("padoc", "hpd", "dots"), default="padoc",
                   help="checkpoint family: padoc (a PaDoc Qwen3-VL checkpoint; the default), hpd (HPD-Parsing's "
                        "InternVL format) or dots (dots.ocr's format)")
    b.add_argument("--base", action="store_true",
                   help="build the tiny Qwen3-VL WITHOUT the protocol (no protocol tokens, no padoc_protocol.json): a "
                        "stand-in for a real base such as Qwen3-VL-2B-Instruct, for `padoc-ray init-model` (--family "
                        "padoc only)")
    b.add_argument("--tie-word-embeddings", action="store_true",
                   help="one matrix for input embeddings and LM head (as Qwen3-VL-2B has; default: separate; --family "
                        "padoc only)")
    b.set_defaults(func=cmd_build_tiny_model)

    im = add_command(sub, "init-model", help="make a PaDoc checkpoint from a Hugging Face Qwen3-VL checkpoint",
                        description="Turn a Qwen3-VL checkpoint (e.g. Qwen/Qwen3-VL-2B-Instruct) into a PaDoc "
                                    "checkpoint to train: add the protocol's control, category and coordinate tokens "
                                    "to its tokenizer as special tokens, grow the input embeddings and the LM head "
                                    "(tied or not; every base row kept bit for bit, each new row the mean of the base "
                                    "token rows), write padoc_protocol.json and the PaDoc chat template, and check "
                                    "that vLLM loads the result and generates with it. Exit 2 for a refused base or "
                                    "output (not Qwen3-VL, already PaDoc, conflicting tokens, non-empty --out), 1 when "
                                    "the vLLM check fails (nothing is written then).")
    im.add_argument("--base", required=True, help="Qwen3-VL checkpoint: a folder or s3://bucket/prefix")
    im.add_argument("--out", required=True, help="folder to write (must be empty or missing, unless --force)")
    im.add_argument("--spec", default=None, metavar="SPEC.json",
                    help="protocol spec (a padoc_protocol.json or a folder holding one; default: the built-in spec)")
    im.add_argument("--force", action="store_true", help="replace a non-empty --out (only once the new one is built)")
    im.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                    help="start a vLLM engine on the result and generate with it (default: on; the CPU engine "
                         "without a GPU). --no-verify skips it")
    add_fields(im, StorageConfig, ("endpoint",), helps={"endpoint": "S3-compatible endpoint URL for an s3:// --base"})
    im.set_defaults(func=cmd_init_model)
