"""Builds the C++ extension only; the project's metadata, version, dependencies and entry points
are in pyproject.toml. Install without build isolation, so the extension is built against the
torch already installed (an isolated build would fetch a second, different torch)::

    pip install --no-build-isolation -e .

An isolated build (plain ``pip install -e .``) sees no torch and builds no extension; the first
use then builds it into a cache (zeropp_hier/quant/_jit.py), from hip_kernels/ in the checkout or,
for a wheel, from the copy ``build_py`` puts at zeropp_hier/_kernel_src.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
KERNEL_SOURCE_SUFFIXES = (".cpp", ".h", ".hip", ".cu", ".py")  # as zeropp_hier/quant/_jit.py hashes


class BuildPyWithKernelSources(build_py):
    """A wheel carries hip_kernels/ as zeropp_hier/_kernel_src, so that an install built without
    torch can still build the kernels on first use. An editable install reads the checkout's."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "zeropp_hier" / "_kernel_src"
        self.mkpath(str(dest))
        for src in sorted((HERE / "hip_kernels").iterdir()):
            if src.suffix in KERNEL_SOURCE_SUFFIXES:
                self.copy_file(str(src), str(dest / src.name))


def _kernel_build():
    spec = importlib.util.spec_from_file_location("hip_kernels_build", HERE / "hip_kernels" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _extensions():
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError:
        # no torch here (build isolation, or none installed yet): the pure-Python package; the
        # kernels are built on first use (zeropp_hier/quant/_jit.py)
        return [], {"build_py": BuildPyWithKernelSources}
    return _kernel_build().extension_modules(), {
        "build_ext": BuildExtension.with_options(use_ninja=True),
        "build_py": BuildPyWithKernelSources,
    }


ext_modules, cmdclass = _extensions()

setup(ext_modules=ext_modules, cmdclass=cmdclass)
