"""Command-line flags derived from the config dataclasses: type, default and help come from the field.

:func:`add_fields` adds one flag per named field of a dataclass: its type from the annotation (``int``,
``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``), its default from an instance of the class
(the class defaults, or the instance a parent config holds, e.g. ``ServeConfig().host``), and its help
from the field's ``#:`` comment (:func:`field_docs`) followed by ``(default: ...)``. :func:`from_args`
builds the instance back from the parsed arguments. Where a public flag predates this module its name,
unit and converter are in the alias table (:func:`aliases`, :class:`Alias`), so no flag is renamed: ``--page-deadline``
sets ``SchedulerConfig.deadline_s``, ``--max-upload-mb`` sets ``ServeConfig.max_upload_bytes`` in MB.

Every flag made here carries ``action.padoc_field = (cls, field name, default of the field)`` so
``tests/test_flags.py`` compares each flag's default with its field's (through the alias's
converter): a default restated by hand cannot drift.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from padoc_ray.cli.common import int_list, page_ranges, positive


# ---- the #: comments of a dataclass --------------------------------------------------------------------
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its ``#:`` comment}, from the class source: the ``#:`` lines right above a field, or
    a trailing ``#:`` on its line (both joined when present). Fields without one are left out."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    tree = ast.parse(textwrap.dedent("".join(lines)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        row = node.lineno - 1  # 0-based line of the field in ``lines``
        above = []
        i = row - 1
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.append(lines[i].strip()[2:].strip())
            i -= 1
        parts = list(reversed(above))
        code = lines[row]
        if "#:" in code:
            parts.append(code.split("#:", 1)[1].strip())
        if parts:
            docs[node.target.id] = " ".join(p for p in parts if p)
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(tp):
    """The type inside ``X | None`` (a flag's value is X; None is its default, or what its alias makes of 0)."""
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def _comma_tuple(item: Callable) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(item(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {item.__name__}, got {text!r}") from None

    return parse


# ---- public flags that predate this module -------------------------------------------------------------
@dataclass(frozen=True)
class Alias:
    """How a field's flag differs from the one its name would give.

    ``flags``: its spellings (the first names it in help; every one works); ``dest``: the argparse
    destination (default: the field name); ``type``/``action``/``metavar``/``choices``: as argparse's;
    ``to_field``: the flag's value -> the field's; ``from_field``: the field's default -> the flag's
    default; ``help``: replaces the field's comment, ``note``: follows it (what the flag's units mean);
    ``default_text``: what help shows for an empty default (None, 0, []); ``show``: formats the default."""

    flags: tuple[str, ...] = ()
    dest: str | None = None
    type: Callable | None = None
    action: str | None = None
    metavar: str | None = None
    choices: tuple | None = None
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    help: str | None = None
    note: str | None = None
    default_text: str | None = None
    show: Callable[[Any], str] | None = None


def _or_none(v):
    """0 (or 0.0) on the command line: None in the config ("no limit" / "off")."""
    return v or None


def _none_is_zero(v):
    return 0 if v is None else v


def _none_if_negative(v):
    """A negative number on the command line: None in the config (where 0 means something: none allowed)."""
    return None if v is not None and v < 0 else v


def _none_is_negative(v):
    return -1 if v is None else v


MB = 2 ** 20


def _range_pair(text: str) -> tuple[int, int]:
    """``N`` or ``MIN,MAX`` with 1 <= MIN <= MAX."""
    try:
        parts = [int(x) for x in text.split(",")] if "," in text else [int(text)] * 2
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX, got {text!r}") from None
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return parts[0], parts[1]


def _resources(text: str) -> dict[str, float]:
    """--engine-resources: a JSON object of custom resource names to amounts."""
    import json

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"padoc_gpu_node\": 1}}', got {text!r} "
                                         f"({e.msg})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of resource names to amounts, got {text!r}")
    return obj


def _positive_ints(text: str) -> tuple[int, ...]:
    """``1,4,16`` -> (1, 4, 16)."""
    return tuple(int_list(text))


def _range_text(v: tuple[int, int]) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]},{v[1]}"


@functools.cache
def aliases() -> dict[tuple[str, str], Alias]:
    """{(class name, field): Alias}: the public flags whose name, unit or parsing is not the field's own."""
    from padoc_ray.raster import ENCODINGS
    from padoc_ray.scheduler.state import DECODE_MODES
    from padoc_ray.trainer.config import BACKENDS, DEVICES

    return {
        ("SchedulerConfig", "deadline_s"): Alias(flags=("--page-deadline", "--deadline"), metavar="SECONDS",
                                                 default_text="none"),
        ("SchedulerConfig", "runaway_window"): Alias(metavar="N", to_field=_or_none, from_field=_none_is_zero,
                                                     note="0: off"),
        ("SchedulerConfig", "branch_retries"): Alias(metavar="K"),
        ("SchedulerConfig", "retry_temperatures"): Alias(metavar="T,T,...", note="comma list"),
        ("SchedulerConfig", "retry_token_budget"): Alias(metavar="TOKENS", to_field=_none_if_negative,
                                                         from_field=_none_is_negative, note="-1: no cap",
                                                         show=lambda v: "no cap" if v < 0 else str(v)),
        ("HostConfig", "mode"): Alias(choices=DECODE_MODES),
        ("HostConfig", "engine"): Alias(choices=("vllm", "noop")),
        ("HostConfig", "max_live_branches"): Alias(default_text="no cap"),
        ("HostConfig", "inject_loops"): Alias(metavar="FRACTION"),
        ("HostConfig", "inject_seed"): Alias(flags=("--seed",), metavar="N"),
        ("ServeConfig", "allowed_hosts"): Alias(flags=("--allowed-host",), metavar="NAME,NAME,...",
                                                 note="comma list; besides 127.0.0.1, localhost and --host"),
        ("ViewerConfig", "allowed_hosts"): Alias(flags=("--allowed-host",), metavar="NAME,NAME,...",
                                                  note="comma list; besides 127.0.0.1, localhost and --host"),
        ("ViewerConfig", "header_timeout_s"): Alias(type=positive(float), metavar="SECONDS"),
        ("LoopsConfig", "gt"): Alias(action="append", metavar="GT.json", to_field=tuple, from_field=list,
                                      note="repeatable"),
        ("LoopsConfig", "profiles"): Alias(metavar="NAME,NAME,..."),
        ("RenderConfig", "dpi"): Alias(default_text="none"),
        ("RenderConfig", "max_page_draws"): Alias(flags=("--page-draw-limit",), metavar="N"),
        ("RendererConfig", "isolate"): Alias(
            flags=("--no-render-isolation",), dest="no_render_isolation", action="store_true",
            to_field=lambda v: not v, from_field=lambda v: not v,
            help="render inside the raster task's own process: no crash isolation and no time-outs (a renderer "
                 "crash then fails the whole task); for benchmarks"),
        ("RendererConfig", "page_timeout_s"): Alias(flags=("--render-timeout",), metavar="SECONDS"),
        ("RendererConfig", "doc_timeout_s"): Alias(flags=("--doc-timeout",), metavar="SECONDS", to_field=_or_none,
                                                   from_field=_none_is_zero, note="0: no limit"),
        ("RendererConfig", "page_budget_s"): Alias(flags=("--page-render-budget",), metavar="SECONDS",
                                                   to_field=_or_none, from_field=_none_is_zero,
                                                   note="0: --doc-timeout alone"),
        ("RendererConfig", "memory_limit_mb"): Alias(flags=("--render-memory-limit-mb",), metavar="MB"),
        ("StorageConfig", "endpoint"): Alias(flags=("--s3-endpoint",), dest="s3_endpoint",
                                             default_text="AWS_ENDPOINT_URL(_S3), else AWS"),
        ("StorageConfig", "read_timeout_s"): Alias(flags=("--read-timeout",), metavar="SECONDS"),
        ("InputLimits", "max_doc_pages"): Alias(flags=("--doc-page-limit",), metavar="N", to_field=_or_none,
                                                from_field=_none_is_zero, note="0: no limit"),
        ("InputLimits", "max_image_frames"): Alias(flags=("--image-frame-limit",), metavar="N"),
        ("InputLimits", "max_file_bytes"): Alias(
            flags=("--file-size-limit-mb",), dest="file_size_limit_mb", type=float, metavar="MB",
            to_field=lambda mb: int(mb * MB) or None, from_field=lambda b: 0 if b is None else b / MB,
            help="refuse input files larger than this many MB, from the listing without reading them, or when read "
                 "if a file grew past it (status file_too_large; 0: no limit)"),
        ("ServeConfig", "max_upload_bytes"): Alias(
            flags=("--max-upload-mb",), dest="max_upload_mb", type=positive(float), metavar="MB",
            to_field=lambda m: int(m * MB), from_field=lambda b: b / MB, help="largest request body; bigger ones "
                                                                              "get 413"),
        ("ServeConfig", "engine_gpus"): Alias(flags=("--gpus-per-replica",)),
        ("ServeConfig", "engine_replicas"): Alias(type=_range_pair, metavar="N|MIN,MAX", from_field=tuple,
                                                  show=_range_text),
        ("ServeConfig", "allowed_s3"): Alias(flags=("--allow-s3",), action="append", metavar="s3://BUCKET[/PREFIX]",
                                             to_field=tuple, from_field=list, note="repeatable"),
        ("ServeConfig", "request_timeout_s"): Alias(flags=("--request-timeout",)),
        ("ServeConfig", "job_lease_s"): Alias(flags=("--job-lease",)),
        ("ServeConfig", "job_ttl_s"): Alias(flags=("--job-ttl",), metavar="SECONDS"),
        ("ServeConfig", "body_timeout_s"): Alias(flags=("--body-timeout",), metavar="SECONDS"),
        ("ServeConfig", "replay_gt"): Alias(flags=("--replay",), dest="replay", metavar="GT.json"),
        ("BatchConfig", "replay_gt"): Alias(flags=("--replay",), dest="replay", metavar="GT.json"),
        ("EnginesConfig", "num_actors"): Alias(flags=("--actors",), type=_range_pair, from_field=tuple,
                                               show=_range_text, note="N or MIN,MAX"),
        ("EnginesConfig", "engine_resources"): Alias(type=_resources, metavar="JSON", from_field=dict),
        ("EnginesConfig", "batch_pages"): Alias(flags=("--engine-batch-pages",)),
        ("InputsConfig", "pages"): Alias(type=page_ranges, to_field=lambda v: None if v is None else tuple(v),
                                         default_text="all",
                                         help="1-based page ranges to parse in every document, e.g. 1-3,7"),
        ("InputsConfig", "manifest_allow"): Alias(action="append", metavar="PREFIX", to_field=tuple, from_field=list),
        ("InputsConfig", "max_pages_per_doc"): Alias(metavar="N", default_text="all"),
        ("RasterConfig", "encoding"): Alias(flags=("--image-encoding",), choices=ENCODINGS),
        ("RasterConfig", "docs_per_task"): Alias(flags=("--raster-docs-per-task",), default_text="auto"),
        ("RasterConfig", "pages_per_block"): Alias(flags=("--raster-pages-per-block",)),
        ("RasterConfig", "cpus"): Alias(flags=("--raster-cpus",)),
        ("RasterConfig", "block_mb"): Alias(flags=("--raster-block-mb",), metavar="MB"),
        ("OutputsConfig", "lock_wait_s"): Alias(flags=("--wait-lock",), metavar="SECONDS"),
        ("OutputsConfig", "leftover_grace_s"): Alias(flags=("--leftover-grace",), metavar="SECONDS"),
        ("OutputsConfig", "lock_stale_s"): Alias(flags=("--lock-stale",), metavar="SECONDS"),
        ("StepConfig", "backend"): Alias(choices=BACKENDS),
        ("PageIoUConfig", "backend"): Alias(choices=("exact", "raster")),
        ("StepsConfig", "batches"): Alias(flags=("--batch",), type=_positive_ints),
        ("ServeBenchConfig", "concurrency"): Alias(type=_positive_ints, note="comma list"),
        ("ServeBenchConfig", "pages"): Alias(metavar="N", note="all when fewer exist"),
        ("ServeBenchConfig", "target"): Alias(choices=("direct", "http")),
        ("ServeBenchConfig", "replay"): Alias(
            flags=("--no-replay",), dest="no_replay", action="store_true", to_field=lambda v: not v,
            from_field=lambda v: not v, help="let the model generate freely (a real checkpoint): the ground truth "
                                             "then only names the pages (default: teacher-force every page with its "
                                             "truth, so the tiny random-weight model does a trained model's work)"),
        ("RayConfig", "device"): Alias(choices=DEVICES),
        ("RayConfig", "resume"): Alias(metavar="CHECKPOINT_DIR"),
        ("AttentionBenchConfig", "device"): Alias(choices=("cpu", "cuda")),
        ("AttentionBenchConfig", "dtype"): Alias(choices=("float32", "float64", "bfloat16", "float16"),
                                                 default_text="by device"),
        ("AttentionBenchConfig", "memory_budget_gib"): Alias(metavar="GIB"),
        ("AttentionBenchConfig", "flex_compile"): Alias(
            flags=("--no-flex-compile",), dest="no_flex_compile", action="store_true", to_field=lambda v: not v,
            from_field=lambda v: not v, help="run flex attention eagerly (slow; materializes the scores) instead of "
                                             "compiled"),
    }


def _alias(cls: type, name: str) -> Alias:
    return aliases().get((cls.__name__, name), Alias())


def dest_of(cls: type, name: str) -> str:
    return _alias(cls, name).dest or name


def _show(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) if v else "none"
    if isinstance(v, dict):
        return "none" if not v else str(v)
    return "none" if v is None else str(v)


def field_default(f: dataclasses.Field):
    """A dataclass field's default (from its factory if it has one)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"field {f.name} has no default: give its flag a base instance")


def add_fields(p, cls: type, names, *, base=None, number: Callable[[Callable], Callable] | None = None,
               numbers=None, helps: dict[str, str] | None = None) -> None:
    """Add a flag for each field of ``cls`` in ``names``, with its default taken from ``base`` (an
    instance of ``cls``; default: the class's field defaults). ``number``: wraps the int/float type (e.g.
    :func:`~padoc_ray.cli.common.positive`) of the fields in ``numbers`` (default: all); ``helps``: help
    texts that replace a field's comment."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints, docs = _hints(cls), field_docs(cls)
    for name in names:
        if name not in fields:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        a = _alias(cls, name)
        value = getattr(base, name) if base is not None else field_default(fields[name])
        default = a.from_field(value) if a.from_field else value
        tp = _unwrap(hints[name])
        kw: dict[str, Any] = {"dest": a.dest or name}
        flags = a.flags or ("--" + name.replace("_", "-"),)
        origin = typing.get_origin(tp)
        if a.action:
            kw["action"] = a.action
            if a.action == "store_true":
                default = bool(default)
        elif tp is bool:
            kw["action"] = argparse.BooleanOptionalAction if value else "store_true"
        elif a.type:
            kw["type"] = a.type
        elif tp in (int, float):
            kw["type"] = number(tp) if number and (numbers is None or name in numbers) else tp
        elif origin is tuple:
            item = typing.get_args(tp)[0]
            kw["type"] = _comma_tuple(item)
        elif tp is not str:
            raise TypeError(f"{cls.__name__}.{name}: no flag type for {tp!r}; give it an Alias")
        if a.action == "append" and a.type:
            kw["type"] = a.type
        if a.metavar:
            kw["metavar"] = a.metavar
        elif "type" in kw and not a.choices:  # named after the flag, not the field (--actors ACTORS)
            kw["metavar"] = flags[0].lstrip("-").replace("-", "_").upper()
        if a.choices:
            kw["choices"] = a.choices
        kw["default"] = default
        text = (helps or {}).get(name) or a.help or docs.get(name) or name.replace("_", " ")
        if a.note:
            text = f"{text} ({a.note})"
        if a.show:
            shown = a.show(default)
        elif a.default_text is not None and default in (None, 0, [], {}):
            shown = a.default_text
        else:
            shown = _show(default)
        text = f"{text} (default: {shown})".replace("``", "").replace("%", "%%")
        action = p.add_argument(*flags, **kw)
        action.help = text  # BooleanOptionalAction appends its own default on some Pythons
        action.padoc_field = (cls, name, value)
        # which fields this parser has flags for: from_args reads those, never a hand-made flag of the same name
        p.set_defaults(**{FIELDS_KEY: (*(p.get_default(FIELDS_KEY) or ()), (cls.__name__, name))})


#: the parsed arguments' record of the fields :func:`add_fields` made flags for
FIELDS_KEY = "_padoc_fields"


def from_args(cls: type, args: argparse.Namespace, base=None, **extra):
    """An instance of ``cls``: ``base`` (default: ``cls()``'s values) with every field that :func:`add_fields`
    gave a flag taken from ``args`` (through its alias's converter), and ``extra`` on top. Fields
    without a flag keep ``base``'s value (or the class default)."""
    kw: dict[str, Any] = {}
    have = set(getattr(args, FIELDS_KEY, ()))
    for f in dataclasses.fields(cls):
        if f.name in extra or (cls.__name__, f.name) not in have:
            continue
        dest = dest_of(cls, f.name)
        if hasattr(args, dest):
            a = _alias(cls, f.name)
            v = getattr(args, dest)
            kw[f.name] = a.to_field(v) if a.to_field else v
    kw.update(extra)
    if base is not None:
        return dataclasses.replace(base, **kw)
    return cls(**kw)


def to_field(action) -> Any:
    """The field value an action's default stands for (through its alias's converter)."""
    cls, name, _ = action.padoc_field
    a = _alias(cls, name)
    return a.to_field(action.default) if a.to_field else action.default


# ---- the scheduler: every SchedulerConfig knob on every parsing surface -----------------------------------
SCHEDULER_FIELDS = ("max_tokens", "max_branches", "deadline_s", "constrain_layout", "runaway_window",
                    "runaway_max_period", "layout_stall_tokens", "skip_contentless", "layout_priority",
                    "page_priority", "stream_branches", "temperature", "repetition_penalty", "loop_detection", "loop_ngram",
                    "loop_count", "loop_window", "loop_max_period", "branch_retries",
                    "retry_temperatures", "retry_seed", "layout_retries", "retry_token_budget",
                    "branch_stream_interval")

def add_scheduler_flags(p, *, number: Callable[[Callable], Callable] | None = None, base=None) -> None:
    """Every :class:`~padoc_ray.scheduler.SchedulerConfig` field as a flag (``--page-deadline`` also spelled
    ``--deadline``; ``--runaway-window 0``: guard off; ``--no-skip-contentless``)."""
    from padoc_ray.scheduler import SchedulerConfig

    add_fields(p, SchedulerConfig, SCHEDULER_FIELDS, base=base, number=number,
               numbers=("max_tokens", "max_branches", "deadline_s"))


def scheduler_from_args(args: argparse.Namespace):
    """The :class:`~padoc_ray.scheduler.SchedulerConfig` the flags of :func:`add_scheduler_flags` say."""
    from padoc_ray.scheduler import SchedulerConfig

    return from_args(SchedulerConfig, args)


# ---- the other flags several commands share ---------------------------------------------------------------
def add_mode(p, *, base=None) -> None:
    """``--mode`` (:attr:`HostConfig.mode <padoc_ray.host.HostConfig.mode>`)."""
    from padoc_ray.host import HostConfig

    add_fields(p, HostConfig, ("mode",), base=base)


def add_max_num_seqs(p) -> None:
    """``--max-num-seqs``: the engine's ``max_num_seqs`` on top of its preset (``HostConfig.engine_overrides``)."""
    from padoc_ray.engine.config import EngineConfig

    p.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"engine max_num_seqs (default: the engine preset's, {EngineConfig.max_num_seqs})")


def engine_overrides(args) -> dict:
    """``HostConfig.engine_overrides`` from ``--max-num-seqs``."""
    return {"max_num_seqs": args.max_num_seqs} if getattr(args, "max_num_seqs", None) else {}


def add_render(p, *, base=None, names=("longest_side", "dpi")) -> None:
    """``--longest-side``, ``--dpi`` (:class:`~padoc_ray.pdf.RenderConfig`)."""
    from padoc_ray.pdf import RenderConfig

    add_fields(p, RenderConfig, names, base=base)
