"""The package's layers, as the README's repository drawing shows them: a module imports only from
layers below its own (every import statement, also those inside functions). An arrow that runs up
the layers, or sideways between two parts of one layer, fails here with the file that draws it."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[2] / "padoc_ray"
assert PKG.is_dir(), PKG

#: bottom to top; a part is a top-level module or sub-package of padoc_ray
LAYERS: list[tuple[str, ...]] = [
    ("knobs",),  # imports no other part: what a config field's flag looks like
    ("status", "storage", "protocol", "metrics", "compat", "pdf_draws"),  # import nothing but knobs
    ("pdf", "groundtruth", "tokenizer", "ray_init", "lease", "listing", "modelstore"),
    ("engine", "output"),
    ("scheduler", "raster", "eval", "checkpoint"),
    ("host", "corpus", "trainer", "viewer"),  # viewer: Serve's page view draws with it
    ("inputs", "doctor", "pipeline", "serve", "perfmodel"),  # perfmodel: the engine model and the Table 3 writer
    ("bench", "curation"),  # curation: re-annotation runs the batch job (pipeline) once per prediction set
    ("cli",),
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str | None:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 and bits[0] == "padoc_ray" else None


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported padoc_ray module) of every import statement of ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # ``from padoc_ray import status`` imports the part ``status``
            names = [f"{mod}.{a.name}" for a in node.names] if mod == "padoc_ray" else [mod]
            out += [(node.lineno, m) for m in names]
    return [(line, m) for line, m in out if m.startswith("padoc_ray.")]


def arrows() -> list[tuple[str, str, str]]:
    """(file:line, from part, to part) of every import between two parts of padoc_ray."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        src = _part(_module_name(path))
        for line, mod in imports(path):
            dst = _part(mod)
            if src and dst and dst != src:
                out.append((f"padoc_ray/{path.relative_to(PKG)}:{line}", src, dst))
    return out


def test_every_part_has_a_layer():
    parts = {_part(_module_name(p)) for p in PKG.rglob("*.py")} - {None}
    assert parts <= set(RANK), f"parts without a layer: {sorted(parts - set(RANK))} (add them to LAYERS and the README)"
    assert not set(RANK) - parts, f"layers name parts that do not exist: {sorted(set(RANK) - parts)}"


def test_no_arrow_runs_up_or_sideways():
    bad = [f"{where}: {src} (layer {RANK[src]}) imports {dst} (layer {RANK[dst]})"
           for where, src, dst in arrows() if RANK[dst] >= RANK[src]]
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_readme_drawing_names_every_layer_in_order():
    readme = (PKG.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Repository layout")
    drawing = readme[start:readme.index("```", readme.index("```", start) + 3)]
    for i, layer in enumerate(LAYERS):
        assert f"layer {i}:" in drawing, f"the README's drawing lacks the heading of layer {i}"
        for part in layer:
            assert f"  {part}" in drawing, f"the README's drawing does not show {part}"


# ---- no import circles, between parts or inside one -------------------------------------------------------
def _runtime_imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The padoc_ray modules ``path`` imports at run time (every statement, also inside functions, but not
    under ``if TYPE_CHECKING:``); ``from pkg import name`` is the module ``pkg.name`` when there is one."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(package.split(".")[: len(package.split(".")) - node.level + 1] +
                             ([node.module] if node.module else [])) if node.level else node.module or "")
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    resolved = set()
    for m in out:  # a name inside a module: the module
        bits = m.split(".")
        while bits and ".".join(bits) not in modules:
            bits.pop()
        if bits and ".".join(bits) != name:
            resolved.add(".".join(bits))
    return resolved


def import_cycles() -> list[list[str]]:
    """The groups of padoc_ray modules that import one another, directly or around a circle (Tarjan)."""
    paths = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}
    graph = {m: sorted(_runtime_imports(p, set(paths))) for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_around_a_circle():
    """A package's __init__ that imports its own modules is no circle; a module that imports one that
    imports it back (here: at function level, which hides it from the interpreter) is."""
    assert import_cycles() == [], "modules importing one another: " + "; ".join(" <-> ".join(c)
                                                                                 for c in import_cycles())
