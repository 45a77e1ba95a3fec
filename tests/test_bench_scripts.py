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

import pytest

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


@pytest.mark.parametrize("folders", [("a", "b"), ("z", "y")])  # the second: the paths sort against the parts
def test_gpu_extra_install_joins_split_wheels_and_merges_shared_folders(tmp_path, folders):
    """`bench/gpu_extra.sh install` rebuilds a wheel split over two transfers, the parts joined in the
    order of their names wherever each folder lies, and unpacks every wheel into one directory, also where
    two wheels fill the same package folder (what pip's --target gets wrong); the PYTHONPATH it prints
    makes the package importable, as nvidia-cutlass-dsl's .pth would."""
    import zipfile

    a, b, site = tmp_path / folders[0], tmp_path / folders[1], tmp_path / "site"
    a.mkdir(), b.mkdir()
    cutlass = "nvidia_cutlass_dsl/dsl_packages/cutlass"
    big = tmp_path / "nvidia_cutlass_dsl_libs_cu13-4.7.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(big, "w") as wheel:
        wheel.writestr(f"{cutlass}/__init__.py", "from cutlass.core import VALUE\n")
        wheel.writestr(f"{cutlass}/_lib.bin", os.urandom(300_000))  # incompressible: parts of real size
    with zipfile.ZipFile(a / "nvidia_cutlass_dsl_libs_core-4.7.1-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{cutlass}/core.py", "VALUE = 42\n")
    data = big.read_bytes()
    (a / f"{big.name}.part.aa").write_bytes(data[:100_000])  # split as `download` splits: aa, ab, ac
    (b / f"{big.name}.part.ab").write_bytes(data[100_000:200_000])
    (b / f"{big.name}.part.ac").write_bytes(data[200_000:])
    result = subprocess.run(["bash", "bench/gpu_extra.sh", "install", str(a), str(b), str(site)], cwd=REPO,
                            capture_output=True, text=True, check=True)
    assert (site / cutlass / "_lib.bin").read_bytes() == zipfile.ZipFile(big).read(f"{cutlass}/_lib.bin")
    assert not list(site.glob("*.whl"))  # the joined wheel is unpacked, then removed
    check = subprocess.run(["bash", "-c", result.stdout + "\npython3 -c 'import cutlass; print(cutlass.VALUE)'"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "42"


def test_gpu_extra_without_arguments_prints_usage():
    result = subprocess.run(["bash", "bench/gpu_extra.sh"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and "download" in result.stderr and "install" in result.stderr
