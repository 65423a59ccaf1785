"""The compiled part of ticklab, and the project files a wheel carries; everything else is declared in pyproject.toml.

A wheel (not an editable install, which runs from the checkout) carries, as ``ticklab/project/``, what ``doctor``,
``capture`` and ``report`` on the user's own data need without a checkout: the notebooks, runners/, kernel/, the
published tables (traces/published/), the tools' sources (tools/, without tools/bin) and pyproject.toml. The captured
bundles (traces/<host-id>/) stay in the checkout. ``ticklab.paths`` finds it after a checkout (issue 56 item 5).
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# (directory or file in the checkout, names left out of it)
CARRIED = [
    ("notebooks", ()),
    ("runners", ()),
    ("kernel", ()),
    ("traces/published", ()),
    ("tools", ("bin", "*.o")),
    ("pyproject.toml", ()),
]


class BuildWithProject(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout itself
        target = Path(self.build_lib) / "ticklab" / "project"
        for name, left_out in CARRIED:
            source = HERE / name
            if not source.exists():
                continue  # an sdist without it: the wheel carries what there is, paths.py says what is missing
            if source.is_dir():
                shutil.copytree(
                    source,
                    target / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *left_out),
                    dirs_exist_ok=True,
                )
            else:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)


# optional: where no C compiler is found the package still installs and ticklab.trace.ringbuf uses its Python walk
setup(
    ext_modules=[
        Extension("ticklab.trace._ringbuf", ["src/ticklab/trace/_ringbuf.c"], optional=True, extra_compile_args=["-O2"])
    ],
    cmdclass={"build_py": BuildWithProject},
)
