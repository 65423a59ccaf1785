"""YAML as ticklab reads it: one loader for every YAML file (experiments, published provenance, the lab's
kernel sources and host recipe), on the shared floor (it imports only PyYAML and ``safefiles``).

``load(text)`` is ``yaml.safe_load`` (the same types: no Python objects) with three refusals, each one line
(``YamlError``, without the file's name: the caller adds it and raises its own error type):

* **anchors and aliases** (``&a`` / ``*a``) are refused while the document is composed, before anything is built:
  ten aliases of ten aliases of ... of a string make a 2.6 KB file stand for gigabytes once anything walks or prints
  it (issue 40: an experiment took 40 s and 350 MB before it was refused). No file ticklab reads needs them;
* an **empty typed scalar** (``runs: !!int ''``, ``!!float``, ``!!bool``, ``!!timestamp``) is refused with the
  key's path (``runs: empty !!int value``): PyYAML raises IndexError or KeyError on it;
* a typed scalar PyYAML cannot build (``!!timestamp 2026-13-45``, an integer of thousands of digits) is refused with
  its path, not as the constructor's bare ValueError.

``preview(value)`` is what an error line quotes of a loaded value: a bounded repr, built without ``repr()`` or
``str()`` of the whole value, escaped (``safefiles.shown``).
"""

from __future__ import annotations

import reprlib

import yaml

from .safefiles import shown

PREVIEW_CHARS = 80
TYPED = {f"tag:yaml.org,2002:{kind}": kind for kind in ("int", "float", "bool", "timestamp")}
KEY_ONLY = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")  # '<<' and '=': built by the mapping, not alone
_BUILD_ERRORS = (ValueError, TypeError, OverflowError, IndexError, KeyError, AttributeError, yaml.YAMLError)


class YamlError(ValueError):
    """YAML ticklab refuses: one line saying where (line or key path) and what, without the file's name."""


class _Loader(yaml.SafeLoader):
    """safe_load's loader whose composer refuses an alias or an anchor the moment it meets one."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise YamlError(
                f"line {event.start_mark.line + 1}: {'alias' if sign == '*' else 'anchor'} "
                f"{sign}{shown(event.anchor, 40)}: YAML anchors and aliases are not accepted (write the "
                "value out where it is used)"
            )
        return super().compose_node(parent, index)


def load(text: str):
    """The one YAML document in ``text`` as Python data (None for an empty document); YamlError otherwise, always
    one line starting with the line it is about (``line N: ...``) where the text has lines."""
    loader = None
    try:
        # built inside the try: the reader checks every character when it is made, and a control character is its
        # ReaderError (issue 55 item 8: it escaped as an internal error)
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _build_scalars(loader, node)
        return loader.construct_document(node)
    except YamlError:
        raise
    except RecursionError:
        raise YamlError("nested too deeply") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if isinstance(text, str) else 1
        character = f"#x{exc.character:04x}" if isinstance(exc.character, int) else shown(repr(exc.character), 20)
        raise YamlError(
            f"line {line}: character {character} is not allowed in YAML ({shown(exc.reason, 80)})"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise YamlError(f"{where}not valid YAML ({shown(' '.join(what.split()), 200)})") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"not valid YAML ({shown(' '.join(str(exc).split()))})") from None
    except _BUILD_ERRORS as exc:  # raised by a constructor outside PyYAML's own errors
        raise YamlError(f"not valid YAML ({_problem(exc)})") from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(path: tuple) -> str:
    where = ""
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else (f".{shown(part, 80)}" if where else shown(part, 80))
    return where or "(top level)"


def _build_scalars(loader: _Loader, root: yaml.Node) -> None:
    """Build every scalar of the composed document on its own (the loader keeps what it built for the document), so
    that one PyYAML cannot build is refused with its key's path. Without aliases the document is a tree."""
    stack: list[tuple[yaml.Node, tuple, bool]] = [(root, (), False)]
    while stack:
        node, path, is_key = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                stack.append((value, (*path, key.value if isinstance(key, yaml.ScalarNode) else "?"), False))
                stack.append((key, path, True))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, index), False) for index, item in reversed(list(enumerate(node.value))))
        elif isinstance(node, yaml.ScalarNode) and node.tag not in KEY_ONLY:
            where = f"line {node.start_mark.line + 1}: {_where(path)}: {'a key: ' if is_key else ''}"
            kind = TYPED.get(node.tag)
            if kind and not node.value.strip():
                raise YamlError(f"{where}empty !!{kind} value")
            try:
                loader.construct_object(node)
            except RecursionError:
                raise
            except _BUILD_ERRORS as exc:
                what = f"!!{kind} value {shown(node.value, 40)!r}" if kind else f"value {shown(node.value, 40)!r}"
                raise YamlError(f"{where}{what} cannot be read ({_problem(exc)})") from None


def _problem(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:  # int() of a number of over 4300 digits (Python's own limit)
        return "a number of thousands of digits"
    return shown(text, 160) if text else type(exc).__name__


class _Preview(reprlib.Repr):
    def __init__(self, limit: int):
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 6, 6, 6, 6
        self.maxstring, self.maxother, self.maxlong = limit, limit, 40

    def repr_int(self, value, level):
        return shown(value, self.maxlong) if value.bit_length() > 4 * self.maxlong else super().repr_int(value, level)


def preview(value, limit: int = PREVIEW_CHARS) -> str:
    """``value`` as an error line quotes it: a repr of at most ~``limit`` characters (a few items of a list or
    mapping, a few levels deep), built from the pieces it shows, never from the whole value; escaped. A long string
    is shown by its head and how many characters its repr has (as safefiles.shown says it)."""
    if isinstance(value, str) and len(value) > limit:
        head = shown(repr(value[: limit + 1]), limit).removesuffix(f" ({len(repr(value[: limit + 1]))} characters)")
        return f"{head} ({len(value) + 2 + sum(1 for c in value if c in chr(92) + chr(39))} characters)"
    return shown(_Preview(limit).repr(value), limit)
