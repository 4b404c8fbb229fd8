"""Command-line flags derived from the config dataclasses: type, default and help come from the field.

:func:`add_fields` adds one flag per named field of a dataclass: its type from the annotation (``int``,
``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``), its default from an instance of the class
(the class defaults, or the instance a parent config holds, e.g. ``ServeConfig().host``), and its help
from the field's ``#:`` comment (:func:`field_docs`) followed by ``(default: ...)``. :func:`from_args`
builds the instance back from the parsed arguments. Where a public flag predates this module its name,
unit and converter are on the field itself (:func:`padoc_ray.knobs.knob`), so no flag is renamed: ``--page-deadline``
sets ``SchedulerConfig.deadline_s``, ``--max-upload-mb`` sets ``ServeConfig.max_upload_bytes`` in MB.

Every flag made here carries ``action.padoc_field = (cls, field name, default of the field)`` so
``tests/contracts/test_flags.py`` compares each flag's default with its field's (through the face's
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
from typing import Any, Callable

from padoc_ray.cli.common import int_list, page_ranges, positive
from padoc_ray.knobs import Face, face_of
from padoc_ray.scheduler.config import SCHEDULER_FLAGS


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
    """The type inside ``X | None`` (a flag's value is X; None is its default, or what its face makes of 0)."""
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


# ---- value parsers a field's Face names (Face.parse) ---------------------------------------------------------
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


def _ints(text: str) -> tuple[int, ...]:
    """``1,4,16`` -> (1, 4, 16)."""
    return tuple(int_list(text))


#: {Face.parse: the argparse type that parses the flag's text}
PARSERS: dict[str, Callable[[str], Any]] = {
    "range_pair": _range_pair,
    "resources": _resources,
    "ints": _ints,
    "page_ranges": page_ranges,
    "positive_float": positive(float),
    "positive_int": positive(int),
    "float": float,
    "int": int,
}


def _face(cls: type, name: str) -> Face:
    return face_of(_fields(cls)[name])


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def dest_of(cls: type, name: str) -> str:
    return _face(cls, name).dest or name


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


def add_fields(p, cls: type, names=None, *, base=None, number: Callable[[Callable], Callable] | None = None,
               numbers=None, helps: dict[str, str] | None = None) -> None:
    """Add a flag for each field of ``cls`` in ``names`` (default: every field), with its default taken from
    ``base`` (an instance of ``cls``; default: the class's field defaults; a field with neither is a required
    flag). A field whose :class:`~padoc_ray.knobs.Face` is ``nested`` adds the flags of the config it holds.
    ``number``: wraps the int/float type (e.g. :func:`~padoc_ray.cli.common.positive`) of the fields in
    ``numbers`` (default: all); ``helps``: help texts that replace a field's comment."""
    fields = _fields(cls)
    for name in names if names is not None else fields:
        if name not in fields:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        a = face_of(fields[name])
        try:
            value = getattr(base, name) if base is not None else field_default(fields[name])
        except TypeError:
            value = _REQUIRED
        if a.nested is not None:
            inner = _unwrap(_hints(cls)[name])
            add_fields(p, inner, a.nested, base=None if value is _REQUIRED else value, number=number,
                       numbers=numbers, helps=helps)
        else:
            _add_one(p, cls, name, a, value, number=number if numbers is None or name in numbers else None,
                     help=(helps or {}).get(name))
        # which fields this parser has flags for: from_args reads those, never a hand-made flag of the same name
        p.set_defaults(**{FIELDS_KEY: (*(p.get_default(FIELDS_KEY) or ()), (cls.__name__, name))})


_REQUIRED = object()


def _add_one(p, cls: type, name: str, a: Face, value, *, number, help: str | None) -> None:
    """The one flag of field ``name`` (its face ``a``, its default ``value``)."""
    required = value is _REQUIRED
    default = None if required else (a.from_field(value) if a.from_field else value)
    tp = _unwrap(_hints(cls)[name])
    kw: dict[str, Any] = {} if a.positional else {"dest": a.dest or name}
    flags = (name,) if a.positional else a.flags or ("--" + name.replace("_", "-"),)
    if a.action:
        kw["action"] = a.action
        if a.action == "store_true":
            default = bool(default)
    elif tp is bool:
        kw["action"] = argparse.BooleanOptionalAction if value else "store_true"
    elif a.parse:
        kw["type"] = PARSERS[a.parse]
    elif tp in (int, float):
        kw["type"] = number(tp) if number else tp
    elif typing.get_origin(tp) is tuple:
        kw["type"] = _comma_tuple(typing.get_args(tp)[0])
    elif tp is not str:
        raise TypeError(f"{cls.__name__}.{name}: no flag type for {tp!r}; give it a knob(parse=...)")
    if a.action == "append" and a.parse:
        kw["type"] = PARSERS[a.parse]
    if a.metavar:
        kw["metavar"] = a.metavar
    elif "type" in kw and not a.choices and not a.positional:  # named after the flag, not the field (--actors ACTORS)
        kw["metavar"] = flags[0].lstrip("-").replace("-", "_").upper()
    if a.choices:
        kw["choices"] = a.choices
    text = help or a.help or field_docs(cls).get(name) or name.replace("_", " ")
    if a.note:
        text = f"{text} ({a.note})"
    if a.required and not a.positional:
        kw["required"] = True
    if required:
        kw["required"] = not a.positional or None
        kw = {k: v for k, v in kw.items() if v is not None}
    else:
        kw["default"] = default
        if a.show:
            shown = a.show(default)
        elif a.default_text is not None and default in (None, 0, [], {}):
            shown = a.default_text
        else:
            shown = _show(default)
        text = f"{text} (default: {shown})"
    action = p.add_argument(*flags, **kw)
    action.help = text.replace("``", "").replace("%", "%%")  # BooleanOptionalAction appends its own default on some Pythons
    action.padoc_field = (cls, name, None if required else value)


#: the parsed arguments' record of the fields :func:`add_fields` made flags for
FIELDS_KEY = "_padoc_fields"


def from_args(cls: type, args: argparse.Namespace, base=None, **extra):
    """An instance of ``cls``: ``base`` (default: ``cls()``'s values) with every field that :func:`add_fields`
    gave a flag taken from ``args`` (through its face's converter; a nested config built the same way), and
    ``extra`` on top. Fields without a flag keep ``base``'s value (or the class default)."""
    kw: dict[str, Any] = {}
    have = set(getattr(args, FIELDS_KEY, ()))
    for f in dataclasses.fields(cls):
        if f.name in extra or (cls.__name__, f.name) not in have:
            continue
        a = face_of(f)
        if a.nested is not None:
            inner = _unwrap(_hints(cls)[f.name])
            kw[f.name] = from_args(inner, args, base=getattr(base, f.name) if base is not None else None)
            continue
        dest = a.dest or f.name
        if hasattr(args, dest):
            v = getattr(args, dest)
            kw[f.name] = a.to_field(v) if a.to_field else v
    kw.update(extra)
    if base is not None:
        return dataclasses.replace(base, **kw)
    return cls(**kw)


def to_field(action) -> Any:
    """The field value an action's default stands for (through its face's converter)."""
    cls, name, _ = action.padoc_field
    a = _face(cls, name)
    if action.default is None and action.required:  # a field without a default: nothing stands for it
        return None
    return a.to_field(action.default) if a.to_field else action.default


# ---- the scheduler: every SchedulerConfig knob on every parsing surface -----------------------------------
#: SchedulerConfig's fields in the order their flags show
SCHEDULER_FIELDS = SCHEDULER_FLAGS

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


def add_render(p, *, base=None, names=("longest_side", "dpi")) -> None:
    """``--longest-side``, ``--dpi`` (:class:`~padoc_ray.pdf.RenderConfig`)."""
    from padoc_ray.pdf import RenderConfig

    add_fields(p, RenderConfig, names, base=base)
