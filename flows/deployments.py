"""Check a deployment name against prefect.yaml: `python -m flows.deployments FLOW/DEPLOYMENT` (scripts/run.sh).

Exits 0 when prefect.yaml defines that deployment; otherwise prints one line that names the closest ones and
lists every valid name, and exits 2. `prefect deployment run` would print a traceback for a name without a
`/` and a bare "not found" for a misspelled one. prefect.yaml is what `run.sh` deploys, so the check needs no
server: a misspelled name is refused before one is started. The flows' names come from flows.names, without
importing Prefect: the check takes a tenth of a second, not the seconds of making every flow.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from pathlib import Path

import yaml

from flows.names import FLOW_NAMES


def deployment_names(prefect_yaml: str | Path = "prefect.yaml") -> list[str]:
    """Every deployment `prefect_yaml` defines, as `prefect deployment run` takes it: FLOW/DEPLOYMENT, the name of
    the flow its entrypoint (`flows.pipeline:train_flow`) names; a flow of another module (one a user added) is
    imported for its name."""
    names = []
    for deployment in yaml.safe_load(Path(prefect_yaml).read_text())["deployments"]:
        path, attribute = deployment["entrypoint"].split(":")
        module = path.removesuffix(".py").replace("/", ".")
        flow_name = FLOW_NAMES.get(attribute) if module == "flows.pipeline" else None
        if flow_name is None:
            flow_name = getattr(importlib.import_module(module), attribute).name
        names.append(f"{flow_name}/{deployment['name']}")
    return sorted(names)


def closest(name: str, names: list[str]) -> list[str]:
    """The names a user most likely meant: those whose deployment part is `name` (`smoke`), else the nearest
    spellings."""
    same_deployment = [n for n in names if n.split("/", 1)[1] == name]
    return same_deployment or difflib.get_close_matches(name, names, n=3, cutoff=0.6)


def unknown_deployment(name: str, names: list[str]) -> str | None:
    """None when `name` is one of `names`, else the one-line error for it."""
    if name in names:
        return None
    guesses = closest(name, names)
    guess = f"did you mean {' or '.join(guesses)}? " if guesses else ""
    return f'error: no deployment "{name}" in prefect.yaml; {guess}valid names (FLOW/DEPLOYMENT): {", ".join(names)}'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.deployments", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="a deployment name, FLOW/DEPLOYMENT (e.g. gpt2-pretrain/smoke)")
    args = parser.parse_args(argv)
    error = unknown_deployment(args.name, deployment_names())
    if error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
