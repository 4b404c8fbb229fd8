"""``doctor``: check a machine before a big run (:mod:`padoc_ray.doctor`)."""

from __future__ import annotations

import json
import os
import sys

from padoc_ray.cli.common import add_command, die


def cmd_doctor(args) -> int:
    from padoc_ray.doctor import DoctorConfig, diagnose, summary_lines

    if args.model is not None and not os.path.isdir(args.model):
        die(f"model directory not found: {args.model}")
    cfg = DoctorConfig(model=args.model, runner=args.runner, start=args.start,
                       extra_processors=tuple(args.logits_processor or ()))
    report = diagnose(cfg)
    for line in summary_lines(report):
        print(line)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    for p in report["problems"]:
        print(f"problem: {p}", file=sys.stderr)
    print("ok" if report["ok"] else f"{len(report['problems'])} problem(s)")
    return 0 if report["ok"] else 1


def register(sub) -> None:
    from padoc_ray.doctor import RUNNER_CHOICES

    d = add_command(sub, "doctor", help="check this machine before a big run (runner, processors, model)",
                    description="Report the versions, CUDA devices, the vLLM model runner an engine will get "
                                "(V1 or Model Runner V2, vLLM's own decision unless --runner names one), the "
                                "attention backend, the logits processors the engine registers and whether "
                                "vLLM's own loader for that runner accepts them, whether teacher forcing uses "
                                "vLLM's trace replay, and with --model the checkpoint's protocol file. Starts no "
                                "engine unless --start. Exit 0 when everything is in order; otherwise 1, with one "
                                "'problem:' line per problem on stderr.")
    d.add_argument("--model", default=None,
                   help="checkpoint directory to check (default: a tiny model built for the check and deleted)")
    d.add_argument("--runner", choices=RUNNER_CHOICES, default="auto",
                   help="auto: the runner vLLM picks on this machine; v1 / v2: check that one "
                        "(an engine gets it with VLLM_USE_V2_MODEL_RUNNER=0 / 1). Default auto")
    d.add_argument("--start", action="store_true",
                   help="also start an engine (on --runner) and parse one teacher-forced page, which must equal "
                        "its truth (the tiny model when --model is not given)")
    d.add_argument("--logits-processor", action="append", metavar="MODULE:CLASS",
                   help="a logits processor of your own the engine would also register "
                        "(EngineConfig.extra['logits_processors']); repeatable")
    d.add_argument("--json", metavar="OUT", default=None, help="also write the report here as JSON")
    d.set_defaults(func=cmd_doctor)
