"""The optional C parts: the prefix index's (``infera.kv._native``, csrc/index.c), the OTLP span encoder
(``infera.telemetry._otlp``, csrc/otlp.c) and tiktoken's encoder for ASCII text (``infera.kv._bpe``, csrc/bpe.c);
everything else is in pyproject.toml.

``optional=True``: without a C compiler or the Python headers the install still succeeds and each runs its
pure-Python path (``infera.kv.native``, ``infera.telemetry.otlp``; tiktoken for ``infera.kv.bpe``). Build them
in place with ``pip install -e .`` (its isolated build brings a setuptools that reads pyproject's SPDX
``license``; ``python setup.py build_ext --inplace`` needs setuptools >= 77 in the environment itself).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "infera.kv._native",
            sources=["csrc/index.c"],
            depends=["csrc/xxhash.h", "csrc/prompt_cache.c", "csrc/prompt_extend.c", "csrc/index_payload.c",
                     "csrc/load.c", "csrc/index_clear.c", "csrc/decide16.c", "csrc/decide17.c", "csrc/decide20.c",
                     "csrc/hold18.c", "csrc/store_u64.c", "csrc/zmq_drain.c", "csrc/zmtp_drain.c", "csrc/ready_bound.c",
                     "csrc/splice.c", "csrc/headers.c"],
            include_dirs=["csrc"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "infera.kv._bpe",
            sources=["csrc/bpe.c"],
            depends=["csrc/xxhash.h"],
            include_dirs=["csrc"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "infera.telemetry._otlp",
            sources=["csrc/otlp.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
