"""The requirements pyproject.toml declares, one per line, ready for ``pip install``: the
package's dependencies plus those of the extras named (the package's own extras, such as
``zeropp-hier[data]`` inside ``test``, expanded), less the distributions named by ``--without``.

The install scripts keep the platform's torch (OLCF's ROCm build on Frontier, an existing CUDA
or ROCm build elsewhere), which is not the one torch pyproject.toml declares, so they install
these requirements without torch and then the package itself with ``--no-deps`` ([Note: the
torch versions claimed] in zeropp_hier/deepspeed/_compat.py). Standard library only (``tomllib``;
pip's vendored ``tomli`` on Python < 3.11): it runs before anything is installed.

    python scripts/requirements.py --without torch test frontier
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _load(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        from pip._vendor import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def distribution(requirement: str) -> str:
    """The distribution a requirement names, normalized (PEP 503): ``Torch>=2`` -> ``torch``."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if name is None:
        raise ValueError(f"pyproject.toml: cannot read the distribution name of requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def requirements(project: dict, extras: list[str], without: set[str]) -> list[str]:
    """The package's requirements with ``extras``, its own extras expanded, less ``without``."""
    own = distribution(project["name"])
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    todo, seen = list(project.get("dependencies", [])), set()
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"requirements.py: pyproject.toml has no extra {extra!r} (it has {sorted(optional)})")
        todo += optional[extra]
    while todo:
        req = todo.pop(0)
        name = distribution(req)
        if name == own:  # zeropp-hier[data]: the extras it names, in place
            for extra in re.findall(r"\[([^\]]*)\]", req)[0].split(","):
                todo += optional[extra.strip()]
        elif name not in {distribution(w) for w in without} and req not in seen:
            seen.add(req)
            out.append(req)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("extras", nargs="*", help="extras of pyproject.toml to include (test, frontier, ...)")
    parser.add_argument("--without", action="append", default=[], help="a distribution to leave out (repeatable)")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    a = parser.parse_args(argv)
    for req in requirements(_load(a.pyproject)["project"], a.extras, set(a.without)):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
