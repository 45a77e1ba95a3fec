python .gpu/ln_outputs.py .gpu/base_tree /tmp/base.pt
python .gpu/ln_outputs.py . /tmp/new.pt
python .gpu/ln_outputs.py .gpu/base_tree /tmp/base.pt
python .gpu/ln_outputs.py . /tmp/new.pt
python - <<'PY'
import torch
a, b = torch.load("/tmp/base.pt"), torch.load("/tmp/new.pt")
same = [k for k in a if all(torch.equal(x, y) for x, y in zip(a[k], b[k]))]
print(f"bit for bit equal: {len(same)} of {len(a)} (shape, config, y dtype) cases")
for k in a:
    if k not in same: print("differs:", k)
PY
