"""YAML documents from files a user gives (policies, manifests), read within bounds.

One reader for both, so both refuse the same things the same way: text that is not UTF-8,
duplicate keys in a mapping (the later one would silently win: two manifests joined
without ``---`` would lose the first), anchors and aliases that expand past
:data:`MAX_VALUES` values (a "billion laughs" file of a few hundred bytes), nesting deeper
than :data:`MAX_DEPTH` levels. Every refusal is a :class:`DocumentError` naming the file
and, for YAML errors, the line and column; nothing here raises anything else.
"""

from __future__ import annotations

from typing import Any

import yaml

# A real object is a few hundred values and a dozen levels deep; the API server keeps
# objects of at most about 1.5 MB (etcd), some 100,000 values. Anchors and aliases may
# repeat a value, but what a document expands to must stay within these.
MAX_VALUES = 100_000
MAX_DEPTH = 64


class DocumentError(ValueError):
    """A file that cannot be read as YAML documents: ``source: detail``. ``kind`` is what
    failed: ``"file"`` (not text), ``"yaml"`` (not YAML) or ``"size"`` (beyond the bounds)."""

    def __init__(self, source: str, kind: str, detail: str) -> None:
        self.source, self.kind, self.detail = source, kind, detail
        super().__init__(f"{source}: {'not valid YAML: ' if kind == 'yaml' else ''}{detail}")


def size_problem(*documents: Any, max_values: int | None = MAX_VALUES,
                 max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``documents`` are too big (values counted over all of them) or one is too deep,
    if so (no recursion; aliases count each time they are used, as a JSON encoder would
    write them out)."""
    stack: list[tuple[Any, int]] = [(document, 0) for document in documents]
    values = 0
    while stack:
        node, depth = stack.pop()
        values += 1
        if max_values is not None and values > max_values:
            return f"more than {max_values} values (aliases included)"
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for pair in node.items() for child in pair)
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return None


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a byte-order mark is dropped), or why not."""
    try:  # not the utf-8-sig codec: it is imported on first use, which may be refused
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DocumentError(source, "file", f"not UTF-8 text: byte 0x{data[exc.start]:02x} "
                            f"at line {line} (offset {exc.start})") from None


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: the later one would silently win."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be plain values, not lists or mappings",
                key_node.start_mark,
            )
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (two documents joined without '---'?)",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def yaml_message(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line, column) and what, without PyYAML's
    ``in "<unicode string>"`` and its excerpt of the text."""
    if isinstance(exc, yaml.reader.ReaderError):
        character = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return (f"character {exc.position + 1}: #x{character:04x} is not allowed in YAML "
                f"({exc.reason})")
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).replace("\n", " ")
    mark = exc.problem_mark or exc.context_mark
    parts = [part for part in (exc.context, exc.problem) if part]
    if exc.context_mark is not None and exc.problem_mark is not None and exc.context and \
            exc.context_mark.line != exc.problem_mark.line:
        parts[0] += f" (line {exc.context_mark.line + 1})"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + ", ".join(parts)


def load(text: str, source: str, *, every: bool = False,
         max_values: int | None = MAX_VALUES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """The documents of ``text`` (one, or with ``every`` all of a ``---`` stream), checked
    against the bounds (values over all of them); raises :class:`DocumentError` and
    nothing else."""
    documents: list[Any] = []
    loader: UniqueKeyLoader | None = None
    try:
        loader = UniqueKeyLoader(text)  # checks that every character is printable
        loader.name = source  # named in PyYAML's own messages too, not "<unicode string>"
        if every:
            while loader.check_data():  # type: ignore[no-untyped-call]
                documents.append(loader.get_data())
        else:
            documents.append(loader.get_single_data())
    except yaml.YAMLError as exc:
        raise DocumentError(source, "yaml", yaml_message(exc)) from None
    except RecursionError:
        raise DocumentError(source, "size", f"nested deeper than {max_depth} levels") from None
    except Exception as exc:  # e.g. a date PyYAML cannot build (2024-02-30)
        raise DocumentError(source, "yaml", f"{type(exc).__name__}: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    problem = size_problem(*documents, max_values=max_values, max_depth=max_depth)
    if problem is not None:
        raise DocumentError(source, "size", problem)
    return documents

