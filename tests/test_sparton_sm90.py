"""The training backward's kernels compiled for Hopper (sm_90) on any machine: Triton's bundled ptxas needs no GPU.

CI has no GPU, so this is where a change that breaks the GPU build of the kernels (a type the interpreter accepts,
a layout that spills) shows first. Each kernel is compiled as a launch on real tensors specializes it: pointers and
row strides 16-byte aligned, unit column stride; the test holds every variant free of register spills.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

_HIDDEN = 768
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _compile(fn, params: dict, constants: dict, aligned: set[str], options: dict):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: ("constexpr" if name in constants else kind) for name, kind in params.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(params) if name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _usage(kernel) -> dict[str, int]:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key: int(value) for key, value in (field.split(":")[:2] for field in line.split() if ":" in field)
            if value.isdigit()}


def _variants():
    from sparton import training

    for dtype, short in _DTYPES.items():
        for double_log in (False, True):
            weight = training.GRAD_WEIGHT_32 if dtype == "float32" else training.GRAD_WEIGHT
            for with_dw in (True, False):
                params = {"tokens_ptr": f"*{short}", "grad_ptr": "*fp32", "out_ptr": "*fp32", "arg_ptr": "*i32",
                          "dw_ptr": f"*{short}", "db_ptr": "*fp32", "stride_tt": "i32", "stride_th": "i32",
                          "stride_gd": "i32", "stride_gv": "i32", "stride_w": "i32", "B": "i32", "V": "i32",
                          "H": "constexpr", "BLOCK_V": "constexpr", "BLOCK_H": "constexpr", "DOUBLE_LOG": "constexpr"}
                constants = {"stride_th": 1, "H": _HIDDEN, "BLOCK_V": weight["BLOCK_V"],
                             "BLOCK_H": weight["BLOCK_H"], "DOUBLE_LOG": double_log}
                if not with_dw:
                    constants["dw_ptr"] = None
                aligned = {name for name in params if name.endswith("_ptr")} | {"stride_tt"}
                name = f"dW {dtype}" if with_dw else f"db alone {dtype}"
                yield (f"{name} double_log={double_log}", training._grad_weight_kernel, params, constants, aligned,
                       {"num_warps": weight["num_warps"], "num_stages": weight["num_stages"]})
            hidden = training.GRAD_HIDDEN_32 if dtype == "float32" else training.GRAD_HIDDEN
            params = {"weight_ptr": f"*{short}", "grad_ptr": "*fp32", "out_ptr": "*fp32", "arg_ptr": "*i32",
                      "bounds_ptr": "*i32", "chunks_ptr": "*i32", "dh_ptr": f"*{short}", "stride_wv": "i32",
                      "stride_wh": "i32", "stride_gd": "i32", "stride_gv": "i32", "stride_w": "i32", "B": "i32",
                      "V": "i32", "H": "constexpr", "BLOCK_T": "constexpr", "BLOCK_V": "constexpr",
                      "BLOCK_H": "constexpr", "DOUBLE_LOG": "constexpr", "DOT_PRECISION": "constexpr"}
            constants = {"stride_wh": 1, "H": _HIDDEN, "BLOCK_T": hidden["BLOCK_T"], "BLOCK_V": hidden["BLOCK_V"],
                         "BLOCK_H": hidden["BLOCK_H"], "DOUBLE_LOG": double_log,
                         "DOT_PRECISION": "tf32x3" if dtype == "float32" else "tf32"}
            aligned = {name for name in params if name.endswith("_ptr")} | {"stride_wv"}
            yield (f"dH {dtype} double_log={double_log}", training._grad_hidden_kernel, params, constants, aligned,
                   {"num_warps": hidden["num_warps"], "num_stages": hidden["num_stages"]})


def _compile_all() -> None:
    """Run in a process of its own: the interpreter tests set TRITON_INTERPRET=1, under which triton.jit makes
    functions that cannot be compiled."""
    seen = []
    for name, fn, params, constants, aligned, options in _variants():
        kernel = _compile(fn, params, constants, aligned, options)
        usage = _usage(kernel)
        seen.append(name)
        print(f"{name}: {usage['REG']} registers, stack {usage['STACK']}, local {usage['LOCAL']}")
        assert usage["STACK"] == 0 and usage["LOCAL"] == 0, f"{name} spills: {usage}"
        if name.startswith("dW") and "float32" not in name:  # 16-bit rows: 8 elements a thread a load, one address
            assert ".v4.b32" in kernel.asm["ptx"], f"{name}: the gathered rows are not loaded 16 bytes at a time"
        if name.startswith("dH"):  # the one-hot product on the tensor cores
            assert "wgmma" in kernel.asm["ptx"], f"{name}: no wgmma"
    assert len(seen) == 18, seen


def test_backward_kernels_compile_for_sm90_without_spills():
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, __file__], env={**env, "PYTHONPATH": str(root)}, capture_output=True,
                          text=True, timeout=600)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


if __name__ == "__main__":
    _compile_all()
