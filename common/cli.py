"""How every `python -m` entry point of data/ and gpt2/ ends on an error: one line, `error: Type: message`,
naming the file, setting or value and what to do (the exceptions' messages say it), then exit status 1.

The traceback is for whoever debugs the code, not for a user with a wrong path: `--debug` anywhere on the
command line (or GPT2_DEBUG=1 in the environment) shows it instead. No prefect import: this runs on GPU hosts.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

DEBUG_FLAG = "--debug"
ERROR_PREFIX = "error: "
# the line `run_cli` ends a process with: `error: Type: message` (a bare `error: message` is a refusal of our own)
_ERROR_LINE = re.compile(rf"{ERROR_PREFIX}(?:(?P<type>[A-Za-z_]\w*): )?")


def error_line_type(line: str) -> str | None:
    """For a line that ends one of our processes (`error: Type: message`): the exception's type name, or "" for
    a bare `error: message`; None for any other line. How a launcher tells what its child failed of."""
    found = _ERROR_LINE.match(line)
    return None if found is None else found.group("type") or ""


def run_cli(main: Callable[[list[str]], object]) -> NoReturn:
    """Call `main` with the command line's arguments (less `--debug`) and exit: 0 once it returns, 1 with one
    `error:` line when it raises, 130 on Ctrl-C. argparse's own errors and `sys.exit` calls pass unchanged."""
    argv = sys.argv[1:]
    debug = DEBUG_FLAG in argv or os.environ.get("GPT2_DEBUG") == "1"
    try:
        main([arg for arg in argv if arg != DEBUG_FLAG])
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if debug:
            raise
        sys.exit(f"{ERROR_PREFIX}{type(e).__name__}: {e}")
    sys.exit(0)
