"""Builds the C++ extension only; the project's metadata, version, dependencies and entry points
are in pyproject.toml. Install without build isolation, so the extension is built against the
torch already installed (an isolated build would fetch a second, different torch)::

    pip install --no-build-isolation -e .
"""

import importlib.util
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _kernel_build():
    spec = importlib.util.spec_from_file_location("hip_kernels_build", HERE / "hip_kernels" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _extensions():
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError:
        # no torch yet: install the pure-Python package; the kernels fall back to the
        # reference implementation and say so once (reinstall after torch to build them)
        return [], {}
    return _kernel_build().extension_modules(), {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()

setup(ext_modules=ext_modules, cmdclass=cmdclass)
