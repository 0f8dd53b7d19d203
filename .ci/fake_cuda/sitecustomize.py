"""Make torch say a CUDA GPU is present, for checking what cells print when one is.

On PYTHONPATH (`.ci/other_machine.py --fake-cuda` puts it there), this file is imported by
every Python process at start-up. It imports nothing heavy: the first `import torch` runs as
usual, then `torch.cuda.is_available()` and its friends answer as on a one-GPU machine. Nothing
can run on that "GPU": a cell that only READS these answers to decide what to print shows
what a GPU user sees; a cell that puts a tensor on it fails, which is the other kind of cell.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def _pretend_cuda(torch) -> None:
    """Answers as on a machine with one CUDA device of compute capability 9.0."""
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_name = lambda device=None: "fake CUDA device (.ci/fake_cuda)"
    cuda.get_device_capability = lambda device=None: (9, 0)
    cuda.is_bf16_supported = lambda *args, **kwargs: True
    torch.backends.cuda.is_built = lambda: True


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds `torch` the normal way, then patches it once it has been executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one shot: the real finders take it from here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _pretend_cuda(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _AfterTorch())
