"""Only the compiled part of ticklab; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

# optional: where no C compiler is found the package still installs and ticklab.trace.ringbuf uses its Python walk
setup(
    ext_modules=[
        Extension("ticklab.trace._ringbuf", ["src/ticklab/trace/_ringbuf.c"], optional=True, extra_compile_args=["-O2"])
    ]
)
