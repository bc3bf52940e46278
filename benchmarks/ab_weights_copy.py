"""How long BERT-base's float32 safetensors take to reach the GPU as 16-bit weights, by method, each in a new process
(CUDA set up first, outside the clock), on idle cores and with every core busy (one spinning process per core, as
the input's tokenizers keep them at an encode's start-up), with PyTorch's expandable segments and without.

    python benchmarks/ab_weights_copy.py   # → prints one line per condition and method, two runs each

What it showed decides model.family.load's order: to the device first, converted there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# BERT-base's tensors: embeddings, 12 layers, the MLM transform and the decoder's bias (~110M parameters)
SHAPES = [((30522, 768), 1), ((512, 768), 1), ((2, 768), 1), ((768,), 2),
          ((768, 768), 4 * 12), ((768,), 4 * 12), ((3072, 768), 12), ((3072,), 12), ((768, 3072), 12), ((768,), 12),
          ((768,), 4 * 12), ((768, 768), 1), ((768,), 3), ((30522,), 1)]

ONE = r"""
import json, mmap, sys, time
import torch
torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from safetensors.torch import load_file
method, path = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if method == "per-tensor to(cuda, bf16)":
    out = {k: v.to("cuda", torch.bfloat16) for k, v in load_file(path).items()}
elif method == "per-tensor to(cuda).to(bf16)":
    out = {k: v.to("cuda").to(torch.bfloat16) for k, v in load_file(path).items()}
elif method == "flat file to(cuda), views":
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little"); header = json.loads(f.read(n))
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    flat = torch.frombuffer(buf, dtype=torch.uint8).to("cuda")
    out = {k: flat[8 + n + m["data_offsets"][0]: 8 + n + m["data_offsets"][1]].view(torch.float32)
           .view(m["shape"]).to(torch.bfloat16) for k, m in header.items() if k != "__metadata__"}
elif method == "load_file(device=cuda)":
    out = {k: v.to(torch.bfloat16) for k, v in load_file(path, device="cuda:0").items()}
torch.cuda.synchronize()
print(f"{time.perf_counter() - t0:.3f}")
"""

METHODS = ("per-tensor to(cuda, bf16)", "per-tensor to(cuda).to(bf16)", "flat file to(cuda), views",
           "load_file(device=cuda)")  # the last two convert on the GPU too


def _seconds(method: str, path: str, conf: str) -> str:
    """One new process's time for `method`, or its error's last line."""
    done = subprocess.run([sys.executable, "-c", ONE, method, path], capture_output=True, text=True,
                          env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf})
    return done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr.strip().splitlines()[-1:]}"


def main() -> None:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="weights-copy-") as tmp:
        path = str(Path(tmp) / "bert.safetensors")
        g = torch.Generator().manual_seed(0)
        state = {f"t{i}": torch.randn(shape, generator=g)
                 for i, shape in enumerate(s for s, n in SHAPES for _ in range(n))}
        save_file(state, path)
        print(len(state), "tensors", sum(v.numel() for v in state.values()) / 1e6, "M params", flush=True)
        for busy in (False, True):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(os.cpu_count() or 1)] if busy else []
            try:
                for conf in ("expandable_segments:True", ""):
                    for method in METHODS:
                        times = [_seconds(method, path, conf) for _ in range(2)]
                        print(f"cores busy={busy} alloc={conf or 'default'} {method}: {times}", flush=True)
            finally:
                for spinner in spinners:
                    spinner.kill()


if __name__ == "__main__":
    main()
