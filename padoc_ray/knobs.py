"""A config field's public face on the command line, declared on the field itself.

Every command's flags are made from config dataclasses (:mod:`padoc_ray.cli.flags`): a field ``deadline_s``
becomes ``--deadline-s``, with its type from the annotation, its default from the field and its help from its
``#:`` comment. Where the public flag differs from what the field's name would give (a name kept from an
older release, a unit: MB on the command line, bytes in the config; 0 meaning "no limit"), the field says so
with :func:`knob` instead of :func:`dataclasses.field`::

    deadline_s: float | None = knob(None, flags=("--page-deadline", "--deadline"), metavar="SECONDS")

So a field's name, flag, unit and help have one home. This module imports nothing of padoc_ray (any layer's
config may use it) and nothing of argparse: :class:`Face` is data, which ``cli/flags.py`` turns into flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

MB = 2 ** 20

_NO = dataclasses.MISSING


@dataclass(frozen=True)
class Face:
    """How a field's flag differs from the one its name would give.

    ``flags``: its spellings (the first names it in help; every one works); ``dest``: the argparse destination
    (default: the field name); ``parse``: the name of a value parser in ``padoc_ray.cli.flags.PARSERS`` (for
    values the annotation cannot say: ``range_pair``, ``resources``, ``ints``, ``page_ranges``,
    ``positive_float``, ``float``); ``action``: ``append`` (a repeatable flag) or ``store_true`` (a switch);
    ``metavar``/``choices``: as argparse's; ``to_field``: the flag's value -> the field's; ``from_field``: the
    field's default -> the flag's default; ``help``: replaces the field's comment, ``note``: follows it (what
    the flag's units mean); ``default_text``: what help shows for an empty default (None, 0, []); ``show``:
    formats the default; ``nested``: the field holds another config, and these of its fields become flags
    (built back into it); ``positional``: the flag is a positional argument; ``required``: the command line must
    give it, though the config has a default for code that builds one."""

    flags: tuple[str, ...] = ()
    dest: str | None = None
    parse: str | None = None
    action: str | None = None
    metavar: str | None = None
    choices: tuple | None = None
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    help: str | None = None
    note: str | None = None
    default_text: str | None = None
    show: Callable[[Any], str] | None = None
    nested: tuple[str, ...] | None = None
    positional: bool = False
    required: bool = False


def knob(default: Any = _NO, *, factory: Callable[[], Any] | Any = _NO, **face: Any) -> Any:
    """A dataclass field (default ``default``, or ``factory()``) whose flag has the :class:`Face` ``face``.
    Without a default the flag is required."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"face": Face(**face)})


def face_of(f: dataclasses.Field) -> Face:
    """The :class:`Face` a field declares (the plain one when it declares none)."""
    return f.metadata.get("face") or _PLAIN


_PLAIN = Face()


# ---- converters that faces share --------------------------------------------------------------------------
def zero_is_none(v):
    """0 (or 0.0) on the command line: None in the config ("no limit" / "off")."""
    return v or None


def none_is_zero(v):
    return 0 if v is None else v


def negative_is_none(v):
    """A negative number on the command line: None in the config (where 0 means something: none allowed)."""
    return None if v is not None and v < 0 else v


def none_is_negative(v):
    return -1 if v is None else v


def negate(v):
    """A ``--no-X`` switch for a field that is on by default."""
    return not v


def comma_text(v) -> str:
    """``("fork", "sequential")`` -> ``fork,sequential`` (a comma-list flag whose default is text)."""
    return ",".join(map(str, v))


def comma_items(v) -> tuple[str, ...]:
    """A comma-list flag's value (parsed, or its default text) as the field's tuple."""
    return tuple(x for x in v.split(",") if x) if isinstance(v, str) else tuple(v)


def range_text(v: tuple[int, int]) -> str:
    """``(2, 2)`` -> ``2``; ``(1, 4)`` -> ``1,4``."""
    return str(v[0]) if v[0] == v[1] else f"{v[0]},{v[1]}"
