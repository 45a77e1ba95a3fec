import runpy
from gpt2 import train
train._save = lambda *a, **k: None  # no final checkpoint: no part of the profile
runpy.run_module("bench.profile_train", run_name="__main__", alter_sys=True)
