"""zeropp-hier: three-level hierarchical ZeRO-3 for DeepSpeed.

Install without build isolation, so the extension is built against the torch already
installed (an isolated build would fetch a second, different torch)::

    pip install --no-build-isolation -e .
"""
import importlib.util
from pathlib import Path

from setuptools import find_packages, setup

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

setup(
    name="zeropp-hier",
    version="0.1.0",
    description="Three-level hierarchical ZeRO-3 (GCD, GPU, node) for DeepSpeed, with per-tier compression",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["zeropp_hier", "zeropp_hier.*"]),
    python_requires=">=3.9",
    # The DeepSpeed range is pinned: the stage-3 subclass hooks internals verified on 0.19.x
    # (zeropp_hier/deepspeed/_compat.py checks it again when the integration is first imported).
    # torch is not pinned: an existing ROCm or CUDA build is kept.
    install_requires=["torch>=2.1", "deepspeed>=0.19.0,<0.20.0", "numpy", "hydra-core>=1.3", "tqdm"],
    extras_require={"test": ["pytest", "hypothesis", "transformers", "accelerate"],
                    "frontier": ["hydra-submitit-launcher"]},
    package_data={"zeropp_hier": ["app/configs/*.yaml", "app/configs/*/*.yaml"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={"console_scripts": ["zeropp-hier-demo=zeropp_hier.app.demo:main",
                                      "zeropp-hier-train=zeropp_hier.app.train:main",
                                      "zeropp-hier-sweep-report=zeropp_hier.tools.sweep_report:main",
                                      "zeropp-hier=zeropp_hier.tools.command:main"]},
)
