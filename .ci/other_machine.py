"""Run the lessons' checked outputs as another machine would: other BLAS kernels, one thread,
or with torch saying a CUDA GPU is present.

nbval compares every `# NBVAL_CHECK_OUTPUT` cell with its saved output. On one machine they
always agree; this script changes what differs between machines and runs nbval again:

  --kernels NAME  OpenBLAS's kernel set for numpy (OPENBLAS_CORETYPE: Sandybridge, Haswell,
                  SkylakeX, ...; the summation order another CPU uses), torch's CPU kernels
                  (ATEN_CPU_CAPABILITY: default / avx2 / avx512) and MKL's code path (torch's
                  CPU matmuls): see KERNEL_SETS.
  --threads N     1 for one thread everywhere (OpenBLAS, OpenMP, MKL, torch).
  --fake-cuda     torch.cuda.is_available() answers True (.ci/fake_cuda/sitecustomize.py): what
                  cells print for a GPU user. Cells that really run on the GPU fail then; name
                  such notebooks with --skip.

Without notebook arguments it runs every lesson (notebooks/NN_*.ipynb) that has a checked cell.
It prints which OpenBLAS kernel numpy actually runs, then nbval's summary; the exit status is
pytest's. Examples:

  .venv/bin/python .ci/other_machine.py --kernels sandybridge --threads 1
  .venv/bin/python .ci/other_machine.py --kernels haswell notebooks/05_causal_mask.ipynb
  .venv/bin/python .ci/other_machine.py --fake-cuda --skip 12_flash_attention
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"

# name -> environment. OPENBLAS_CORETYPE picks numpy's OpenBLAS kernels (any x86-64 CPU runs
# Sandybridge's AVX and Haswell's AVX2 ones; SkylakeX needs AVX-512). ATEN_CPU_CAPABILITY caps
# torch's vectorised kernels; MKL_ENABLE_INSTRUCTIONS caps MKL, and MKL_CBWR=COMPATIBLE makes it
# take its plainest code path.
KERNEL_SETS: dict[str, dict[str, str]] = {
    "sandybridge": {
        "OPENBLAS_CORETYPE": "Sandybridge",
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "COMPATIBLE",
    },
    "haswell": {
        "OPENBLAS_CORETYPE": "Haswell",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    # Every library off this CPU's default at once, one library per summation order: OpenBLAS's
    # AVX kernels, torch's plain (non-SIMD) kernels, MKL's AVX2 path (MKL_ENABLE_INSTRUCTIONS=AVX2
    # alone changed lesson 09's float32 projections by 1.07e-06 on an AVX-512 Xeon). .ci/run's set.
    "mixed": {
        "OPENBLAS_CORETYPE": "Sandybridge",
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "skylakex": {
        "OPENBLAS_CORETYPE": "SkylakeX",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_CBWR": "COMPATIBLE",
    },
}

PROBE = """
import numpy, torch
try:
    from threadpoolctl import threadpool_info
    blas = [f"{d['internal_api']} {d.get('architecture')} x{d['num_threads']}"
            for d in threadpool_info() if d['user_api'] == 'blas']
except ImportError:  # ask numpy's bundled OpenBLAS itself
    import ctypes, glob, os
    blas = ['(OpenBLAS kernel not found)']
    libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__) + '.libs', '*openblas*'))
    for lib in map(ctypes.CDLL, libs):
        for prefix in ('scipy_openblas_', 'openblas_'):
            for suffix in ('64_', '_64_', ''):
                fn = getattr(lib, f'{prefix}get_corename{suffix}', None)
                nt = getattr(lib, f'{prefix}get_num_threads{suffix}', None)
                if fn is not None and nt is not None:
                    fn.restype = ctypes.c_char_p
                    blas = [f'openblas {fn().decode()} x{nt()}']
print('numpy BLAS:', ', '.join(blas), '| torch CPU capability:',
      torch.backends.cpu.get_cpu_capability(), 'x', torch.get_num_threads(),
      '| torch.cuda.is_available():', torch.cuda.is_available())
"""


def checked_lessons() -> list[Path]:
    """Every lesson notebook with at least one cell whose output nbval compares."""
    import nbformat
    from nbval.plugin import find_comment_markers

    def checked(cell) -> bool:
        tags = cell.metadata.get("tags", [])
        return cell.cell_type == "code" and (
            bool(dict(find_comment_markers(cell.source)).get("check"))
            or "nbval-check-output" in tags
        )

    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [p for p in paths if any(checked(c) for c in nbformat.read(p, as_version=4).cells)]


def environment(kernels: str | None, threads: int | None, fake_cuda: bool) -> dict[str, str]:
    """This process's environment with the chosen kernels, threads and CUDA answer."""
    env = dict(os.environ)
    env.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py sets it without a GPU
    if kernels:
        env.update(KERNEL_SETS[kernels])
    if threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    if fake_cuda:
        extra = str(ROOT / ".ci" / "fake_cuda")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--kernels", choices=sorted(KERNEL_SETS))
    parser.add_argument("--threads", type=int)
    parser.add_argument("--fake-cuda", action="store_true")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME",
                        help="leave out notebooks whose name contains NAME (repeatable)")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: none)")
    args = parser.parse_args(argv)

    notebooks = args.notebooks or checked_lessons()
    notebooks = [p for p in notebooks if not any(s in p.name for s in args.skip)]
    if not notebooks:
        parser.error("no notebooks left to run")
    env = environment(args.kernels, args.threads, args.fake_cuda)
    print(f"other machine: kernels={args.kernels or 'this CPU'} threads={args.threads or 'default'}"
          f" fake_cuda={args.fake_cuda}; {len(notebooks)} notebooks", flush=True)
    subprocess.run([str(PYTHON), "-c", PROBE], env=env, cwd=ROOT, check=True)
    cmd = [str(PYTHON), "-m", "pytest", "--nbval-lax", "--nbval-current-env",
           "--nbval-cell-timeout=300", "-p", "no:cacheprovider", "-q", "-rf"]
    if args.workers:
        cmd += ["-n", str(args.workers), "--dist", "loadscope"]
    cmd += [str(p) for p in notebooks]
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
