"""Fuzz families of issue 40 for the YAML ticklab reads (experiments and published provenance.yaml, through
ticklab.yamlsafe):

yaml-aliases      alias bombs and single anchors or aliases, added to a real experiment (runners/*/*.yaml) or a real
                  provenance.yaml: nested lists or mappings of 2-10 aliases of the level below, 1-12 levels deep, the
                  last one made the value of an existing key (a later key wins) or of a new one, at the top or under
                  a key; a lone anchor; an alias of a scalar; a merge key ``<<: *a``; an alias of a mapping; an
                  alias as a key; a self-reference. Every one must be refused in one line that says anchors and
                  aliases are not accepted, within 2 s (a 2.6 KB file took 40 s and 350 MB before); accepted, or
                  refused for another reason or slowly, is "wrong".
yaml-empty-typed  an empty typed scalar (``!!int ''``, ``!!float ""``, ``!!bool ' '``, ``!!timestamp "\\t"``) as the
                  value of a random key or list item, or as a key, of a real experiment or provenance.yaml. Every one
                  must be refused in one line naming the key's path ('runs: empty !!int value'); accepted, or refused
                  without the path (an IndexError's words), is "wrong".
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import fuzzcases as cases
from fuzzcases import REPO, Outcome, writable_copy

SENTINEL = "__TICKLAB_FUZZ_VALUE__"
TAGS = ["int", "float", "bool", "timestamp"]
EMPTIES = ["''", '""', "' '", '"\\t"', '"  "']
MAX_SECONDS = 2.0  # a refusal of an alias bomb takes milliseconds: one that takes seconds expanded something


class _Targets:
    """Real experiments and published claims to add to, and how to load each kind."""

    def prepare(self, seeds: Path) -> None:
        # the loaders imported here, before the worker says it is ready: pandas' import alone can take seconds on a
        # loaded machine, which the first input would otherwise pay inside its deadline
        import ticklab.analysis.published
        import ticklab.capture.experiment  # noqa: F401
        from ticklab.paths import published_dir

        # the claims' experiments (runners/vm holds the guest image and lab host recipes, not experiments)
        self.experiments = sorted(p for p in (REPO / "runners").glob("*/*.yaml") if p.parent.name != "vm")
        self.published = seeds / "yaml-published"
        if not self.published.is_dir():
            shutil.copytree(published_dir(), self.published)
        self.claims = sorted(p.name for p in self.published.iterdir() if (p / "provenance.yaml").is_file())

    def target(self, source, work: Path) -> tuple[str, Path, object]:
        """(what, the file to edit, a call that loads it)."""
        from ticklab.analysis.published import load_published
        from ticklab.capture.experiment import load_experiment

        if source.integer(0, 1):
            seed = source.choice(self.experiments)
            path = work / "experiment.yaml"
            path.write_bytes(seed.read_bytes())
            return f"{seed.parent.name}/{seed.name}", path, lambda: load_experiment(path)
        claim = source.choice(self.claims)
        root = work / "yaml-published"
        writable_copy(self.published / claim, root / claim)
        return f"published/{claim}", root / claim / "provenance.yaml", lambda: load_published(root, claim)


def _timed(call):
    """``call`` with its seconds: (result, seconds) through a list the classifier cannot see."""
    took = []

    def run():
        started = time.monotonic()
        try:
            return call()
        finally:
            took.append(time.monotonic() - started)

    return run, took


class YamlAliasFamily(_Targets):
    name = "YAML anchors and aliases (alias bombs)"
    key = "yaml-aliases"
    SHAPES = [
        "bomb",
        "bomb",
        "bomb under a key",
        "mapping bomb",
        "lone anchor",
        "scalar alias",
        "merge alias",
        "alias as a key",
        "self reference",
        "anchor on an existing key",
    ]

    def case(self, source, work: Path) -> Outcome:
        import yaml

        what, path, load = self.target(source, work)
        text = path.read_text(encoding="utf-8")
        keys = list(yaml.safe_load(text))
        key = source.choice(keys) if source.integer(0, 3) else "extra_key"
        shape = source.choice(self.SHAPES)
        levels, fan = source.integer(1, 12), source.integer(2, 10)
        leaf = '"' + "x" * source.integer(1, 200) + '"'
        if shape in ("bomb", "bomb under a key", "mapping bomb"):
            indent = "  " if shape == "bomb under a key" else ""
            lines = ["defs:"] if indent else []
            lines.append(f"{indent}b0: &b0 {leaf}")
            for level in range(1, levels + 1):
                if shape == "mapping bomb":
                    items = ", ".join(f"k{i}: *b{level - 1}" for i in range(fan))
                    lines.append(f"{indent}b{level}: &b{level} {{{items}}}")
                else:
                    lines.append(f"{indent}b{level}: &b{level} [{', '.join([f'*b{level - 1}'] * fan)}]")
            lines.append(f"{key}: *b{levels}")
            added = "\n".join(lines)
            detail = f"{shape} {levels}x{fan} as {key}"
        elif shape == "lone anchor":
            added, detail = f"{key}: &a {leaf}", f"anchor on {key}"
        elif shape == "scalar alias":
            added, detail = f"a: &a {leaf}\n{key}: *a", f"alias as {key}"
        elif shape == "merge alias":
            added, detail = f"base: &base {{x: {leaf}}}\n{key}:\n  <<: *base\n  y: 1", f"merge into {key}"
        elif shape == "alias as a key":
            added, detail = f"k: &k name\n{key}: {{*k : 1}}", f"alias key under {key}"
        elif shape == "self reference":
            added, detail = f"{key}: &a [*a]", f"self reference as {key}"
        else:  # an anchor inside the file's own text: on the first line that starts with an existing key
            lines = text.splitlines()
            index = next((i for i, line in enumerate(lines) if line.startswith(f"{key}:")), None)
            if index is None or key == "extra_key":
                added, detail = f"{key}: &a {leaf}", f"anchor on {key}"
            else:
                lines[index] = (
                    lines[index].replace(f"{key}:", f"{key}: &a", 1)
                    if lines[index].rstrip() != f"{key}:"
                    else f"{key}: &a"
                )
                text, added, detail = "\n".join(lines) + "\n", "", f"anchor on existing {key}"
        path.write_text(text + ("\n" + added + "\n" if added else ""), encoding="utf-8")
        run, took = _timed(load)
        outcome = cases.classify(run, known_bad=True, bounded=True)
        if outcome.kind == "error" and "YAML anchors and aliases are not accepted" not in outcome.detail:
            outcome = Outcome("wrong", f"refused, but not for its aliases: {outcome.detail}", True)
        elif outcome.kind == "error" and took and took[0] > MAX_SECONDS:
            outcome = Outcome("wrong", f"refused after {took[0]:.1f} s: {outcome.detail}", True)
        outcome.detail = f"{what} {detail}: {outcome.detail}"
        return outcome


def _where(path: tuple) -> str:
    where = ""
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where or "(top level)"


def _places(data, path=()) -> list[tuple[tuple, str]]:
    """Every value (a mapping's value or a list's item) and every mapping (for a new key) in ``data``: (path, 'value'
    or 'key')."""
    found = []
    if isinstance(data, dict):
        found.append((path, "key"))
        for key, value in data.items():
            found.append(((*path, key), "value"))
            found += _places(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found.append(((*path, index), "value"))
            found += _places(value, (*path, index))
    return found


class YamlEmptyTypedFamily(_Targets):
    name = "YAML empty typed values"
    key = "yaml-empty-typed"

    def case(self, source, work: Path) -> Outcome:
        import yaml

        what, path, load = self.target(source, work)
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        places = [p for p in _places(data) if all(isinstance(k, (str, int)) for k in p[0])]
        where, kind = source.choice(places)
        tag, empty = source.choice(TAGS), source.choice(EMPTIES)
        if kind == "key":
            parent = data
            for part in where:
                parent = parent[part]
            parent[SENTINEL] = 1
            expected = f"{_where(where)}: a key: empty !!{tag} value"
        else:
            parent = data
            for part in where[:-1]:
                parent = parent[part]
            parent[where[-1]] = SENTINEL
            expected = f"{_where(where)}: empty !!{tag} value"
        text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=1 << 16)
        assert text.count(SENTINEL) == 1, "the sentinel is written once, plain"
        path.write_text(text.replace(SENTINEL, f"!!{tag} {empty}"), encoding="utf-8")
        outcome = cases.classify(load, known_bad=True, bounded=True)
        if outcome.kind == "error" and not outcome.detail.endswith(expected):
            outcome = Outcome("wrong", f"refused without the key's path ({expected!r}): {outcome.detail}", True)
        outcome.detail = (
            f"{what} !!{tag} {empty} at {_where(where)}{' (a key)' if kind == 'key' else ''}: {outcome.detail}"
        )
        return outcome
