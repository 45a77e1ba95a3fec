"""Two machines, simulated on loopback: two torchrun launchers (one rank each) meet through torchrun's c10d
rendezvous, started as the train stage starts each node (tasks.launch.torchrun_command with a
`rendezvous` of nnodes=2 and the same endpoint), and train exactly like one launcher with both ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
import torch

from tasks.launch import Rendezvous, torchrun_command
from tests.fixtures.processes import free_port
from tests.fixtures.train.tiny import read_metrics, tiny_config

pytestmark = pytest.mark.slow


def write_config(path, config) -> str:
    path.write_text(json.dumps(dataclasses.asdict(config)))
    return str(path)


def test_two_nodes_through_c10d_rendezvous_train_like_one_node_with_both_ranks(tmp_path):
    common = dict(batch_size=2, total_batch_size=64, max_steps=4, warmup_steps=1, val_every=4, val_steps=2,
                  device="cpu")
    one_node = tiny_config(tmp_path / "one", **common)
    two_nodes = dataclasses.replace(one_node, out_dir=str(tmp_path / "two" / "run"))  # one shared run directory
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    # one machine, both ranks
    cmd = torchrun_command("gpt2.train", ["--config", write_config(tmp_path / "one.json", one_node)], nproc=2,
                           run_id="one")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]

    # two machines, one rank each: the same command on each, any may start first (docs/pipeline.md)
    rendezvous = Rendezvous(nnodes=2, rdzv_endpoint=f"127.0.0.1:{free_port()}")
    config = write_config(tmp_path / "two.json", two_nodes)
    cmd = torchrun_command("gpt2.train", ["--config", config], nproc=1, rendezvous=rendezvous, run_id="run-two")
    assert "--rdzv-id=run-two" in cmd
    nodes = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)

    resolved = json.loads((tmp_path / "two" / "run" / "config.json").read_text())["resolved"]
    assert resolved["world_size"] == 2
    losses_one = [r["loss"] for r in read_metrics(one_node.out_dir)]
    losses_two = [r["loss"] for r in read_metrics(two_nodes.out_dir)]
    assert len(losses_two) == 4
    torch.testing.assert_close(torch.tensor(losses_two), torch.tensor(losses_one), rtol=1e-6, atol=1e-6)
    val_one, val_two = read_metrics(one_node.out_dir, "val")[-1], read_metrics(two_nodes.out_dir, "val")[-1]
    assert val_two["val_loss"] == pytest.approx(val_one["val_loss"], abs=1e-5)
