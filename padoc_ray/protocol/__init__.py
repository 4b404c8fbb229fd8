"""The PaDoc token protocol: spec, page types, serializers/parsers, decode depth, rendering, and the
checkpoint families that speak it (``padoc``; ``hpd``: HPD-Parsing, :mod:`.hpd`; see :mod:`.family`).

Pure Python: imports no ray, vllm, torch or transformers (a test enforces it), so the scheduler's
decisions, the evaluator and the trainer's packing can all build on it anywhere.
"""

from .codec import (
    ERROR_CODES,
    PaDocSample,
    ParsedBranch,
    RawRegion,
    SerializeError,
    StreamParser,
    assemble_page,
    child_prompt,
    dequantize,
    parse_branch,
    parse_padoc,
    parse_sequential,
    quantize,
    quantized,
    serialize_padoc,
    serialize_sequential,
)
from .depth import DecodeDepth, decode_depth, depth_from_trace
from .grammar import LayoutCursor, LayoutGrammar
from .hpd import HpdSpec, HpdVocab
from .hpd_image import hpd_tile_grid
from .page import Box, Page, PageFormatError, Region, load_omnidocbench, page_from_omnidocbench, page_to_omnidocbench
from .render import markdown_spans, to_json, to_markdown
from .spec import SPEC_FILENAME, ProtocolError, ProtocolSpec, TextTokenizer
from .vocab import Vocab

__all__ = [
    "ERROR_CODES", "PaDocSample", "ParsedBranch", "RawRegion", "SerializeError", "StreamParser",
    "assemble_page", "child_prompt", "dequantize", "parse_branch", "parse_padoc", "parse_sequential",
    "quantize", "quantized", "serialize_padoc", "serialize_sequential", "DecodeDepth", "decode_depth",
    "depth_from_trace", "LayoutCursor", "LayoutGrammar", "Box", "Page", "PageFormatError", "Region", "load_omnidocbench",
    "page_from_omnidocbench", "page_to_omnidocbench", "markdown_spans", "to_json", "to_markdown", "SPEC_FILENAME",
    "ProtocolError", "ProtocolSpec", "TextTokenizer", "Vocab", "HpdSpec", "HpdVocab", "hpd_tile_grid",
]
