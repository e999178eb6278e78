"""``zeropp-hier`` and ``python -m zeropp_hier``: one command for everything the package does.
Each subcommand hands the rest of its command line, unchanged, to the tool that implements it,
so ``zeropp-hier <subcommand> --help`` shows that tool's own options.

    zeropp-hier train [Hydra overrides]          the main job (zeropp_hier.app.train); -m sweeps
    zeropp-hier train ... dryrun.nodes=9408      one rank of that job in this process (zeropp_hier.dryrun)
    zeropp-hier data prepare --stdlib --out D    tokenize text into token files for train (zeropp_hier.app.data.tokens)
    zeropp-hier plan --params 20B --nodes 48     predicted step of every layout (zeropp_hier.planner)
    zeropp-hier probe --out probe.json           time each tier in the current world (one process per rank)
    zeropp-hier report multirun/<date>/<time>    one table for a sweep (zeropp_hier.tools.sweep_report)
    zeropp-hier checkpoint verify DIR            check a tag against its manifest
    zeropp-hier checkpoint to-universal SRC OUT  convert a tag for another number of ranks
    zeropp-hier checkpoint export-hf CKPT/TAG --out DIR   a Hugging Face model (safetensors + config.json)
    python -m zeropp_hier cluster setup|status|teardown   the emulated cluster (root; from the repository root)
    python -m zeropp_hier cluster compare                 the side-by-side benchmark on it

Docs: docs/usage.md#the-zeropp-hier-command.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

CLUSTER_HELP = (
    "the emulated cluster: setup | status | teardown | uplink-down | uplink-loss | uplink-clear "
    "(benchmarks.cluster) or compare (benchmarks.compare). Needs root and the repository "
    "checkout (benchmarks/ is not part of the installed package): run python -m zeropp_hier cluster "
    "from the repository root."
)
NEEDS_CHECKOUT = (
    "error: zeropp-hier cluster needs the repository checkout: benchmarks/ is not part of the "
    "installed package. From the repository root run 'sudo python -m zeropp_hier cluster ...' "
    "(or 'sudo python -m benchmarks.cluster setup|status|teardown', 'sudo python -m benchmarks.compare')"
)


def _train(rest: list[str]) -> int:
    if any(a.startswith("dryrun.nodes=") for a in rest):  # one rank of the job, in this process
        from .dryrun import cli as dryrun_cli

        return dryrun_cli.main(rest)
    # Hydra reads its overrides from sys.argv: hand it exactly what followed "train"
    from .app import train

    saved = sys.argv
    sys.argv = [saved[0], *rest]
    try:
        train.main_for_rank()
    finally:
        sys.argv = saved
    return 0


def _plan_or_probe(name: str) -> Callable[[list[str]], int]:
    def run(rest: list[str]) -> int:
        from .tools import cli

        return cli.main([name, *rest])

    return run


def _report(rest: list[str]) -> int:
    from .tools import sweep_report

    return sweep_report.main(rest)


def _data(rest: list[str]) -> int:
    from .app.data import tokens as data

    return data.main(rest, prog="zeropp-hier data")


# checkpoint commands run here, before the checkpoint tool's own parser (which lists them in --help)
CHECKPOINT_TOOLS = {
    "export-hf": "a Hugging Face model directory (safetensors + config.json) from a tag: CKPT/TAG --out DIR"
}


def _checkpoint(rest: list[str]) -> int:
    if rest and rest[0] == "export-hf":
        from .tools import export_hf

        return export_hf.main(rest[1:])
    problem = checkpoint_dir_problem(rest)
    if problem:
        print(f"zeropp-hier checkpoint: error: {problem}", file=sys.stderr)
        return 2
    from .deepspeed import checkpoint

    return checkpoint.main(rest, prog="zeropp-hier checkpoint", others=CHECKPOINT_TOOLS)


def checkpoint_dir_problem(rest: list[str]) -> str | None:
    """The checkpoint directory named on a ``verify`` / ``to-universal`` command line is absent
    or not a directory: said here, before the checkpoint tool looks inside it."""
    if not rest or rest[0] not in ("verify", "to-universal"):
        return None
    positional, skip = [], False
    for a in rest[1:]:
        if skip:
            skip = False
        elif a == "--tag":
            skip = True
        elif not a.startswith("-"):
            positional.append(a)
    if not positional:
        return None  # the tool's own parser says what is missing
    name = "DIR" if rest[0] == "verify" else "SRC"
    d = positional[0]
    if not os.path.exists(d):
        return (
            f"{rest[0]} {name} {d!r}: no such directory; give the checkpoint directory that save_checkpoint "
            "wrote (the one holding 'latest' and the tag directories)"
        )
    if not os.path.isdir(d):
        return f"{rest[0]} {name} {d!r}: not a directory; give the checkpoint directory, not a file in it"
    return None


def _import_benchmarks(module: str):
    """``benchmarks`` lives in the repository beside the package, not in the installed package:
    it imports when Python runs from the repository root (``python -m`` puts the current
    directory first on ``sys.path``); anywhere else the command says so and stops."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name not in ("benchmarks", "benchmarks.cluster", module):
            raise
    raise SystemExit(NEEDS_CHECKOUT)


def _cluster(rest: list[str]) -> int:
    if rest and rest[0] == "compare":
        return _import_benchmarks("benchmarks.compare.run").main(rest[1:])
    return _import_benchmarks("benchmarks.cluster.__main__").main(rest)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "train": (_train, "the main job, a Hydra app: arguments are Hydra overrides (preset=zeropp steps=5; -m sweeps)"),
    "data": (_data, "prepare DIR: tokenize local text (or --stdlib) into memory-mapped token files"),
    "plan": (_plan_or_probe("plan"), "predict one step of every layout and compression, ranked (arithmetic only)"),
    "probe": (_plan_or_probe("probe"), "time all_gather / all_to_all per tier in the current world (bandwidth)"),
    "report": (_report, "one table (markdown + CSV) for the runs of a Hydra sweep"),
    "checkpoint": (
        _checkpoint,
        "verify DIR | to-universal SRC OUT | export-hf TAG --out DIR: check, convert or export a checkpoint tag",
    ),
    "cluster": (_cluster, CLUSTER_HELP),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="zeropp-hier", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from . import __version__

    ap.add_argument("--version", action="version", version=f"zeropp-hier {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_, text) in COMMANDS.items():
        # add_help=False: "-h" after the subcommand goes to the tool itself
        p = sub.add_parser(name, help=text, description=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the subcommand's arguments go to it untouched (argparse would otherwise try to read
    # options such as "-m" or "--params" itself)
    if argv and argv[0] in COMMANDS:
        return int(COMMANDS[argv[0]][0](argv[1:]) or 0)
    parser().parse_args(argv)  # --help, --version, or an error naming the choices
    return 2


if __name__ == "__main__":
    sys.exit(main())
