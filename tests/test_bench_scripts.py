"""The GPU bench scripts, run here at their own defaults with the GPU parts stubbed out.

`bench/run_train_gpu.sh` is run as is, with a `python` that answers "1 GPU" and records the torchrun
command instead of training, and an `nvidia-smi` stub; the recorded gpt2.train flags must pass
gpt2.train's own validation on the shards the script generated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STUB_PYTHON = f"""#!/usr/bin/env bash
# a GPU host's python for the bench script: 1 GPU; torchrun only records its arguments
if [ "$1" = -c ] && [[ "$2" == *device_count* ]]; then echo 1; exit 0; fi
if [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then
    printf '%s\\n' "$@" > "$RECORD"; exit 0
fi
exec {sys.executable} "$@"
"""


def test_run_train_gpu_defaults_pass_gpt2_train_validation(tmp_path):
    from gpt2.train_config import load_config, validate

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(STUB_PYTHON)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'name, driver_version, memory.total'\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    record, out = tmp_path / "torchrun_args", tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "OUT": str(out), "RECORD": str(record)}
    subprocess.run(["bash", "bench/run_train_gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    args = record.read_text().splitlines()
    flags = args[args.index("gpt2.train") + 1:]
    config = load_config(flags)
    assert config.max_steps == 40 and config.total_batch_size == 524288  # the script's defaults
    validate(config, world_size=1)  # raises ConfigError naming what is wrong
