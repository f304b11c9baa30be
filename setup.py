"""The optional C part of the prefix index (``infera.kv._native``, csrc/index.c); everything else is in pyproject.toml.

``optional=True``: without a C compiler or the Python headers the install still succeeds and the index runs
its pure-Python path (``infera.kv.native``). Build it in place with ``python setup.py build_ext --inplace``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "infera.kv._native",
            sources=["csrc/index.c"],
            depends=["csrc/xxhash.h"],
            include_dirs=["csrc"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
