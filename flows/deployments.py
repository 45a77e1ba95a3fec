"""Check a deployment name against the server: `python -m flows.deployments FLOW/DEPLOYMENT` (scripts/run.sh).

Exits 0 when the server holds that deployment; otherwise prints one line that names the closest ones and
lists every valid name, and exits 2. `prefect deployment run` would print a traceback for a name without a
`/` and a bare "not found" for a misspelled one.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from prefect.client.orchestration import SyncPrefectClient, get_client


def deployment_names(client: SyncPrefectClient) -> list[str]:
    """Every deployment of the server, as `prefect deployment run` takes it: FLOW/DEPLOYMENT."""
    flows = {flow.id: flow.name for flow in client.read_flows()}
    return sorted(f"{flows[d.flow_id]}/{d.name}" for d in client.read_deployments() if d.flow_id in flows)


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
    return f'error: no deployment "{name}" on this server; {guess}valid names (FLOW/DEPLOYMENT): {", ".join(names)}'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.deployments", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="a deployment name, FLOW/DEPLOYMENT (e.g. gpt2-pretrain/smoke)")
    args = parser.parse_args(argv)
    with get_client(sync_client=True) as client:
        error = unknown_deployment(args.name, deployment_names(client))
    if error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
