"""How every `python -m` entry point of data/ and gpt2/ ends on an error: one line, `error: Type: message`,
naming the file, setting or value and what to do (the exceptions' messages say it), then exit status 1.

The traceback is for whoever debugs the code, not for a user with a wrong path: `--debug` anywhere on the
command line (or GPT2_DEBUG=1 in the environment) shows it instead. No prefect import: this runs on GPU hosts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

DEBUG_FLAG = "--debug"


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
        sys.exit(f"error: {type(e).__name__}: {e}")
    sys.exit(0)
