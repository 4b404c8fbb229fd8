"""Every flag of every command, checked against the config dataclasses (padoc_ray.cli.flags).

The table is built live from the ``padoc-ray`` argparse tree and the ``jobs/*.py`` parsers: a flag
made from a field must default to that field's value (through its face's converter), a hand-written
flag must not shadow a field's flag, every flag that existed before the flags were derived
(tests/data/flags_before_i26.json) must still exist with its default, and every SchedulerConfig knob
must be reachable, the same way, on every parsing surface.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import tempfile

import pytest

from tests.conftest import ROOT

JOBS = ("batch_parse", "reannotate", "train")


def _job_parser(job: str) -> argparse.ArgumentParser:
    """The parser ``jobs/<job>.py`` parses with (its own main(), stopped before it parses)."""
    from padoc_ray.cli import common

    spec = importlib.util.spec_from_file_location(f"_padoc_job_{job}", os.path.join(ROOT, "jobs", f"{job}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.job_main = lambda prog, desc, add_args, _run, argv=None: common.job_parser(prog, desc, add_args)
    return mod.main()


def _walk(p: argparse.ArgumentParser, path: tuple[str, ...], out: dict) -> None:
    out[path] = p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                _walk(sub, (*path, name), out)


@pytest.fixture(scope="module")
def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """{command path: its parser}: ("parse",), ("bench", "serve"), ("jobs/batch_parse.py",) ..."""
    from padoc_ray.cli import build_parser

    out: dict = {}
    _walk(build_parser(), (), out)
    for job in JOBS:
        out[(f"jobs/{job}.py",)] = _job_parser(job)
    return out


def _options(p: argparse.ArgumentParser):
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def flag_table(parsers) -> list[dict]:
    """One row per flag of every command: its spellings, default, and the field it was made from."""
    from padoc_ray.cli.flags import to_field

    rows = []
    for path, p in sorted(parsers.items()):
        for a in _options(p):
            field = getattr(a, "padoc_field", None)
            rows.append({
                "command": " ".join(path), "flags": list(a.option_strings), "dest": a.dest, "default": a.default,
                "field": f"{field[0].__name__}.{field[1]}" if field else None,
                "field_default": field[2] if field else None,
                "as_field": to_field(a) if field else None,
            })
    return rows


def test_every_field_flag_defaults_to_its_field(parsers, tmp_path):
    rows = flag_table(parsers)
    made = [r for r in rows if r["field"]]
    assert len(made) > 100  # the table is live, and most flags come from fields
    wrong = [r for r in made if r["as_field"] != r["field_default"]]
    assert not wrong, wrong
    with open(tmp_path / "flags.json", "w") as f:  # the table, for a reader of a failed run
        json.dump(rows, f, indent=1, default=repr)


def test_each_field_flag_default_is_the_config_s_own(parsers):
    """The base a field's flag takes its default from is the config a command builds: the class
    defaults, or the parent config's (serve: ServeConfig's host, 32 pages in flight)."""
    from padoc_ray.host import HostConfig
    from padoc_ray.serve.config import ServeConfig

    for path, p in parsers.items():
        for a in _options(p):
            if not hasattr(a, "padoc_field"):
                continue
            cls, name, value = a.padoc_field
            if path == ("serve",) and cls is HostConfig:
                want = getattr(ServeConfig(model="m").host, name)
            elif path == ("serve",) and cls is ServeConfig:
                want = getattr(ServeConfig(model="m"), name)
            else:
                f = {f.name: f for f in dataclasses.fields(cls)}[name]
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    assert a.required, (path, a.option_strings, "a field without a default must be a required flag")
                    continue
                want = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert value == want, (path, a.option_strings)


def test_no_hand_written_flag_shadows_a_field_flag(parsers):
    """A flag spelled like the flag of a shared config's field (the scheduler's, the host's, rendering,
    storage, input caps) is made from that field wherever it appears, unless it means something else
    on purpose (bench pipeline's own defaults for its no-op actor)."""
    own = {("bench", "pipeline"): {"--pages-in-flight", "--dpi"},  # its no-op actor's and raw side's own
           ("bench", "raster"): {"--dpi"},  # one DPI for every tool compared
           # --seed: the injected loops' on bench replay/serve; elsewhere the seed of that tool's own generator
           ("corpus", "generate"): {"--dpi", "--seed"}, ("build-tiny-model",): {"--seed"},
           ("bench", "pageiou"): {"--seed"}}
    shared = {"SchedulerConfig", "HostConfig", "RenderConfig", "RendererConfig", "StorageConfig", "InputLimits"}
    field_flags = {s for p in parsers.values() for a in _options(p)
                   if getattr(a, "padoc_field", (type,))[0].__name__ in shared for s in a.option_strings}
    bad = [(path, a.option_strings) for path, p in parsers.items() for a in _options(p)
           if not hasattr(a, "padoc_field") and set(a.option_strings) & field_flags
           and not set(a.option_strings) <= own.get(path, set())]
    assert not bad, bad


def test_every_flag_of_before_still_exists_with_its_default(parsers):
    """Add flags, rename none: each flag of the CLI before issue 26 keeps its spellings and default."""
    with open(os.path.join(ROOT, "tests", "data", "flags_before_i26.json")) as f:
        text = f.read().replace("<ROOT>", ROOT).replace("<TMP>", tempfile.gettempdir())
    before = json.loads(text)
    by_name = {" ".join(path): p for path, p in parsers.items()}
    for cmd, flags in before.items():
        now = {s: a for a in _options(by_name[cmd]) for s in a.option_strings}
        for old in flags.values():
            for spelling in old["flags"]:
                assert spelling in now, (cmd, spelling)
                d = now[spelling].default
                d = list(d) if isinstance(d, tuple) else d
                want = old["default"]
                want = list(want) if isinstance(want, tuple) else want
                assert d == want or d == argparse.SUPPRESS and want == "SUPPRESS", (cmd, spelling, d, want)
                assert now[spelling].required == old["required"], (cmd, spelling)


def _knob_fields() -> list[tuple[type, str, tuple[str, ...]]]:
    """(class, field, the flags its face names) of every config field declared with a renamed flag, found by
    reading the package's source for ``knob(... flags=...)`` and importing the modules that have one."""
    import ast
    import importlib
    import pathlib

    from padoc_ray.knobs import face_of

    pkg = pathlib.Path(ROOT) / "padoc_ray"
    out = []
    for path in sorted(pkg.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "knob(" not in text or path.name == "knobs.py":
            continue
        mod = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and dataclasses.is_dataclass(getattr(mod, node.name, None)):
                for f in dataclasses.fields(getattr(mod, node.name)):
                    if face_of(f).flags:
                        out.append((getattr(mod, node.name), f.name, face_of(f).flags))
    return out


def test_every_renamed_flag_a_field_declares_exists(parsers):
    """A field whose knob names its flags (a public name older than the field's) has those flags, all of
    them, on some command: a face cannot name a flag nobody gets."""
    seen: dict[tuple[type, str], set[str]] = {}
    for p in parsers.values():
        for a in _options(p):
            if hasattr(a, "padoc_field"):
                cls, name, _ = a.padoc_field
                seen.setdefault((cls, name), set()).update(a.option_strings)
    fields = _knob_fields()
    assert len(fields) > 30  # the scan is live
    for cls, name, flags in fields:
        assert (cls, name) in seen, f"{cls.__name__}.{name}: no command has its flag {flags[0]}"
        assert set(flags) <= seen[(cls, name)], (cls.__name__, name, flags, seen[(cls, name)])


SURFACES = {
    "parse": ["parse", "--input", "in", "--output", "out", "--model", "m"],
    "parse-page": ["parse-page", "x.pdf", "--model", "m"],
    "demo": ["demo"],
    "serve": ["serve", "--model", "m"],
    "bench replay": ["bench", "replay", "--gt", "g", "--images", "i", "--model", "m", "--out", "o"],
    "bench serve": ["bench", "serve", "--gt", "g", "--images", "i", "--model", "m", "--out", "o"],
    "reannotate": ["reannotate", "--source", "s", "--output", "o", "--model", "m"],
}
KNOBS = ["--max-tokens", "100", "--max-branches", "7", "--page-deadline", "5", "--runaway-window", "64",
         "--runaway-max-period", "8", "--layout-stall-tokens", "32", "--no-skip-contentless", "--layout-priority",
         "--page-priority", "--stream-branches", "--constrain-layout", "--temperature", "0.5"]


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_every_scheduler_knob_is_reachable(surface, parsers):
    from padoc_ray.scheduler import SchedulerConfig

    path = tuple(a for a in SURFACES[surface] if not a.startswith("-"))[:2 if surface.startswith("bench") else 1]
    have = {a.padoc_field[1] for a in _options(parsers[path])
            if getattr(a, "padoc_field", (None,))[0] is SchedulerConfig}
    assert have == {f.name for f in dataclasses.fields(SchedulerConfig)}


def _built_scheduler(surface, args):
    """The SchedulerConfig the command itself puts in the config it builds."""
    from padoc_ray.cli import batch, bench, serve
    from padoc_ray.cli.flags import scheduler_from_args

    if surface in ("parse", "reannotate"):
        return batch.config_from_args(args).engines.host.scheduler
    if surface == "serve":
        return serve.config_from_args(args).host.scheduler
    if surface.startswith("bench"):
        return bench.config_from_args(args).host.scheduler
    return scheduler_from_args(args)


def test_the_same_flags_give_the_same_scheduler_everywhere():
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.flags import scheduler_from_args
    from padoc_ray.scheduler import SchedulerConfig

    p = build_parser()
    want = SchedulerConfig(max_tokens=100, max_branches=7, deadline_s=5.0, runaway_window=64, runaway_max_period=8,
                           layout_stall_tokens=32, skip_contentless=False, layout_priority=True, page_priority=True,
                           stream_branches=True, constrain_layout=True, temperature=0.5)
    for surface, argv in SURFACES.items():
        args = p.parse_args([*argv, *KNOBS])
        assert scheduler_from_args(args) == want, surface
        assert _built_scheduler(surface, args) == want, surface
        assert _built_scheduler(surface, p.parse_args(argv)) == SchedulerConfig(), surface  # defaults: the class's
        # --deadline is --page-deadline; --runaway-window 0 turns the guard off
        args = p.parse_args([*argv, "--deadline", "3", "--runaway-window", "0"])
        assert scheduler_from_args(args) == SchedulerConfig(deadline_s=3.0, runaway_window=None), surface


def test_every_command_s_help_parses(parsers, capsys):
    for path, p in parsers.items():
        with pytest.raises(SystemExit) as e:
            p.parse_args(["--help"])
        assert e.value.code == 0, path
        out = capsys.readouterr().out
        assert out.startswith("usage: ") and "%(" not in out, path


def test_help_shows_the_field_default_and_comment(parsers):
    p = parsers[("parse",)]
    text = p.format_help()
    assert "--runaway-window N" in text and "(default: 512)" in text
    assert "--skip-contentless, --no-skip-contentless" in text
    assert "--page-deadline SECONDS, --deadline SECONDS" in text


def test_field_docs_read_the_comments_above_and_beside_a_field():
    from padoc_ray.cli.flags import field_docs
    from padoc_ray.scheduler import SchedulerConfig
    from padoc_ray.storage import StorageConfig

    docs = field_docs(SchedulerConfig)
    assert docs["max_tokens"].startswith("generated tokens per stream")  # trailing #:
    assert docs["layout_stall_tokens"].startswith("the layout stream must close a region")  # the line above
    assert "period of at most" in docs["runaway_window"]  # several lines above
    assert field_docs(StorageConfig)["read_timeout_s"].startswith("one file's whole read")


def test_converters_keep_today_s_units(parsers):
    """MB on the command line, bytes in the config; 0 = no limit = None."""
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.batch import config_from_args as batch_config
    from padoc_ray.cli.serve import config_from_args as serve_config

    p = build_parser()
    cfg = batch_config(p.parse_args([*SURFACES["parse"], "--doc-page-limit", "0", "--file-size-limit-mb", "1.5",
                                     "--actors", "2,5", "--no-render-isolation", "--doc-timeout", "0",
                                     "--pages", "1-2", "--mode", "sequential", "--rows-per-file", "9"]))
    assert cfg.inputs.limits.max_doc_pages is None and cfg.inputs.limits.max_file_bytes == int(1.5 * 2 ** 20)
    assert cfg.engines.num_actors == (2, 5) and cfg.raster.renderer.isolate is False
    assert cfg.raster.renderer.doc_timeout_s is None and cfg.inputs.pages == (0, 1)
    assert cfg.mode == "sequential" == cfg.engines.host.mode and cfg.outputs.rows_per_file == 9
    s = serve_config(p.parse_args([*SURFACES["serve"], "--max-upload-mb", "2", "--gpus-per-replica", "1",
                                   "--engine-replicas", "1,3", "--allow-s3", "s3://b/p"]))
    assert s.max_upload_bytes == 2 << 20 and s.engine_gpus == 1 and s.engine_replicas == (1, 3)
    assert s.allowed_s3 == ("s3://b/p",) and s.host.pages_in_flight == 32
