"""The PaDoc protocol spec: which token strings mean what, and how boxes and contents are encoded.

A spec travels with a checkpoint as ``padoc_protocol.json`` in the model directory, so a real PaDoc
checkpoint whose control tokens are spelled differently is used by writing another spec file, not by
changing code. This module only knows token *strings*; turning them into ids needs a tokenizer
(see :class:`~padoc_ray.protocol.vocab.Vocab`). It imports nothing heavy (no ray, vllm, torch or transformers).

Streams (ids shown as token names)::

    layout stream (fork mode):  R_OPEN CAT X1 Y1 X2 Y2 R_CLOSE ... R_OPEN ... R_CLOSE EOS
    content branch k:           BRANCH_START content-tokens... EOS
    sequential stream:          R_OPEN CAT X1 Y1 X2 Y2 R_CLOSE content... R_OPEN ... content... EOS

The child prompt of branch k is: page prompt + layout tokens *before* region k's R_CLOSE +
BRANCH_START (paper, Appendix E.2).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Mapping, Protocol, Sequence

SPEC_FILENAME = "padoc_protocol.json"
SPEC_VERSION = 1

CONTENT_FORMATS = ("text", "latex", "html", "none")

#: OmniDocBench block categories and the content format each one carries.
DEFAULT_CATEGORIES: dict[str, str] = {
    "title": "text",
    "text_block": "text",
    "figure": "none",
    "figure_caption": "text",
    "figure_footnote": "text",
    "table": "html",
    "table_caption": "text",
    "table_footnote": "text",
    "equation_isolated": "latex",
    "equation_caption": "text",
    "header": "text",
    "footer": "text",
    "page_number": "text",
    "page_footnote": "text",
    "abandon": "text",
    "code_txt": "text",
    "code_txt_caption": "text",
    "reference": "text",
    "code_algorithm": "text",
    "code_algorithm_caption": "text",
}

BOX_FIELDS = ("x1", "y1", "x2", "y2")


class ProtocolError(ValueError):
    """A spec that is inconsistent, or a tokenizer that lacks the spec's tokens."""


@dataclass(frozen=True, kw_only=True)
class ControlTokens:
    """Token strings of the control tokens."""

    region_open: str = "<|region|>"  #: opens one region of the layout stream
    region_close: str = "<|/region|>"  #: closes it; the fork trigger
    branch_start: str = "<|branch|>"  #: first input of every content branch
    end_of_stream: str = "<|im_end|>"  #: ends the layout stream, each branch, and the sequential stream


@dataclass(frozen=True, kw_only=True)
class CategorySpec:
    name: str
    token: str
    content_format: str  # one of CONTENT_FORMATS


@dataclass(frozen=True, kw_only=True)
class CoordinateSpec:
    """Boxes are normalized to ``bins`` bins per axis; one token per coordinate."""

    bins: int = 1000
    token_format: str = "<|coord_{}|>"  #: ``str.format``-ed with the bin number
    #: order of the fields after R_OPEN; "category" plus the four box fields
    region_fields: tuple[str, ...] = ("category", "x1", "y1", "x2", "y2")


@dataclass(frozen=True, kw_only=True)
class ProtocolSpec:
    family: ClassVar[str] = "padoc"  #: the checkpoint family this spec describes (see protocol.family)
    tokens: ControlTokens = field(default_factory=ControlTokens)
    categories: tuple[CategorySpec, ...] = ()
    coordinates: CoordinateSpec = field(default_factory=CoordinateSpec)
    #: user-turn text after the image, per mode
    prompt_text: Mapping[str, str] = field(
        default_factory=lambda: {"fork": "Parse the page: layout.", "sequential": "Parse the page."}
    )
    #: chat wrapping of the prompt; ``{image}`` is the single unexpanded image placeholder
    prompt_template: str = (
        "<|im_start|>user\n{image}{text}<|im_end|>\n<|im_start|>assistant\n"
    )
    image_placeholder: str = "<|vision_start|><|image_pad|><|vision_end|>"
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        if not self.categories:
            object.__setattr__(self, "categories", default_category_specs())
        self.validate()

    # ---- derived views -------------------------------------------------------------------
    @property
    def category_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.categories)

    def content_format(self, category: str) -> str:
        for c in self.categories:
            if c.name == category:
                return c.content_format
        raise ProtocolError(f"unknown category {category!r}")

    def coord_token(self, b: int) -> str:
        return self.coordinates.token_format.format(b)

    def all_added_tokens(self) -> list[str]:
        """Every token string a tokenizer must hold as one token, in a stable order."""
        t = self.tokens
        out = [t.region_open, t.region_close, t.branch_start, t.end_of_stream]
        out += [c.token for c in self.categories]
        out += [self.coord_token(b) for b in range(self.coordinates.bins)]
        return list(dict.fromkeys(out))

    def validate(self) -> None:
        names = [c.name for c in self.categories]
        if len(set(names)) != len(names):
            raise ProtocolError("duplicate category names in spec")
        for c in self.categories:
            if c.content_format not in CONTENT_FORMATS:
                raise ProtocolError(f"category {c.name!r}: content_format {c.content_format!r} not in {CONTENT_FORMATS}")
        if self.coordinates.bins < 2:
            raise ProtocolError("coordinates.bins must be >= 2")
        if "{}" not in self.coordinates.token_format:
            raise ProtocolError("coordinates.token_format needs a '{}' for the bin number")
        fields = self.coordinates.region_fields
        if sorted(fields) != sorted(("category",) + BOX_FIELDS):
            raise ProtocolError(f"coordinates.region_fields must be a permutation of category,x1,y1,x2,y2; got {fields}")
        t = self.tokens
        control = [t.region_open, t.region_close, t.branch_start, t.end_of_stream]
        if len(set(control)) != 4:
            raise ProtocolError("control tokens must be four distinct strings")
        cat_tokens = [c.token for c in self.categories]
        if len(set(cat_tokens)) != len(cat_tokens) or set(cat_tokens) & set(control):
            raise ProtocolError("category tokens must be distinct from each other and from control tokens")
        for mode in ("fork", "sequential"):
            if mode not in self.prompt_text:
                raise ProtocolError(f"prompt_text needs a {mode!r} entry")
        if "{image}" not in self.prompt_template or "{text}" not in self.prompt_template:
            raise ProtocolError("prompt_template needs {image} and {text}")

    def prompt(self, mode: str) -> str:
        """The page prompt as text, holding one unexpanded image placeholder."""
        if mode not in self.prompt_text:
            raise ProtocolError(f"unknown mode {mode!r}; expected one of {sorted(self.prompt_text)}")
        return self.prompt_template.format(image=self.image_placeholder, text=self.prompt_text[mode])

    # ---- (de)serialization ----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["categories"] = [asdict(c) for c in self.categories]
        d["coordinates"]["region_fields"] = list(self.coordinates.region_fields)
        d["prompt_text"] = dict(self.prompt_text)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "ProtocolSpec":
        try:
            version = int(d.get("version", SPEC_VERSION))
            if version != SPEC_VERSION:
                raise ProtocolError(f"spec version {version} is not supported (this build reads {SPEC_VERSION})")
            coords = dict(d.get("coordinates", {}))
            if "region_fields" in coords:
                coords["region_fields"] = tuple(coords["region_fields"])
            kwargs = {k: d[k] for k in ("prompt_template", "image_placeholder") if k in d}
            if "prompt_text" in d:
                kwargs["prompt_text"] = dict(d["prompt_text"])
            return cls(
                tokens=ControlTokens(**d.get("tokens", {})),
                categories=tuple(CategorySpec(**c) for c in d.get("categories", ())),
                coordinates=CoordinateSpec(**coords),
                version=version,
                **kwargs,
            )
        except TypeError as e:  # unknown or missing keys
            raise ProtocolError(f"malformed protocol spec: {e}") from e

    def save(self, model_dir: str | os.PathLike) -> str:
        path = os.path.join(os.fspath(model_dir), SPEC_FILENAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, ensure_ascii=False)
            f.write("\n")
        return path

    @classmethod
    def load(cls, model_dir_or_file: str | os.PathLike) -> "ProtocolSpec":
        path = os.fspath(model_dir_or_file)
        if os.path.isdir(path):
            path = os.path.join(path, SPEC_FILENAME)
        if not os.path.exists(path):
            raise ProtocolError(f"no protocol spec at {path}: a PaDoc checkpoint needs a {SPEC_FILENAME}")
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ProtocolError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(data)


def default_category_specs() -> tuple[CategorySpec, ...]:
    return tuple(CategorySpec(name=n, token=f"<|cat_{n}|>", content_format=f) for n, f in DEFAULT_CATEGORIES.items())


# ---- the text families' specs (hpd, dots) as JSON ----------------------------------------------------


def text_spec_to_dict(spec, family: str) -> dict:
    """A text family's spec (:class:`~padoc_ray.protocol.hpd.HpdSpec`, :class:`~padoc_ray.protocol.dots.DotsSpec`)
    as the JSON a ``padoc_protocol.json`` holds."""
    d = asdict(spec)
    d["family"] = family
    d["prompt_text"] = dict(spec.prompt_text)
    return d


def text_spec_from_dict(cls, d: Mapping, *, tokens_cls, categories: Mapping[str, str], names: Mapping[str, str]):
    """A text family's spec from a ``padoc_protocol.json``'s fields: its category map and names add to (and
    override) the family's defaults; a field the spec lacks is a :class:`ProtocolError`."""
    d = {k: v for k, v in d.items() if k not in ("family", "version")}
    try:
        if "tokens" in d:
            d["tokens"] = tokens_cls(**d["tokens"])
        if "categories" in d:
            d["categories"] = {**categories, **d["categories"]}
        if "names" in d:
            d["names"] = {**names, **d["names"]}
        return cls(**d)
    except TypeError as e:
        raise ProtocolError(f"malformed {cls.family} protocol spec: {e}") from e


# ---- binding a spec to a tokenizer ------------------------------------------------------------


class TextTokenizer(Protocol):
    """What the protocol needs from a tokenizer: content text <-> ids, and added-token lookup."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...
