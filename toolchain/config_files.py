"""The one reader of Invoke configuration files (YAML), for `raytrain` and for the project's own files.

Invoke reads its YAML with `yaml.safe_load` and then deep-copies and merges what it read. A file with
a few nested aliases ("billion laughs") expands exponentially there, and no answer came in a minute,
even under a key nothing uses; a 5,000-deep list hit the recursion limit; YAML 1.1 reads `1:20` as
80 (base 60), `010` as 8 and `1_0` as 10. Here a file is read only when it is a regular file of at most
MAX_BYTES, with at most MAX_ALIASES aliases that expand to at most MAX_EXPANDED nodes in all, nesting at
most MAX_DEPTH deep, no key twice in one mapping, a byte-order mark only at its start, and numbers as
YAML 1.2's core schema reads them: decimal digits (`010` is 10, `020000` is 20000, as an INVOKE_*
variable reads them), `0o` octal, `0x` hex, no `_` and no base 60 (`1_0` and `1:20` stay strings,
which the settings then refuse with the field's own message). Anything else is a ConfigFileError: one
line, exit 2.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from runtime.files import FileReadError, read_regular
from toolchain.boundary import ConfigFileError

MAX_BYTES = 1 << 20
MAX_ALIASES = 20
MAX_DEPTH = 32
MAX_EXPANDED = 20_000  # values the document holds, once its aliases are expanded (Invoke deep-copies it)

# YAML 1.2's core schema (SafeLoader's are YAML 1.1's: base 60, leading-zero octal, `_` separators)
# (an int is decimal digits: `010` is 10, as an INVOKE_* variable reads it; a float has a point or an exponent)
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounds on aliases and depth, no duplicate keys and no base-60 numbers."""

    def __init__(self, stream, source: str):
        super().__init__(stream)
        self.source, self.aliases, self.depth, self.nodes = source, 0, 0, 0

    def _fail(self, node_or_mark, what: str) -> ConfigFileError:
        mark = getattr(node_or_mark, "start_mark", node_or_mark)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        return ConfigFileError(f"{self.source}: {line}{what}; fix or remove that file")

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise self._fail(self.peek_event(), f"more than {MAX_ALIASES} aliases (*name); a configuration "
                                                    "file needs few, and many expand without bound")
        self.nodes += 1
        if self.nodes > MAX_EXPANDED:
            raise self._fail(self.peek_event(), f"more than {MAX_EXPANDED} values; a configuration file needs far fewer")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._fail(self.peek_event(), f"nested more than {MAX_DEPTH} deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        """An int as YAML 1.2 reads it (SafeLoader's would take `0o17`'s digits as decimal and `017` as octal)."""
        text = self.construct_scalar(node)
        return int(text[2:], 8) if text.startswith("0o") else int(text[2:], 16) if text.startswith("0x") else int(text, 10)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and _expanded(node, {}) > MAX_EXPANDED:
            raise self._fail(node, f"its aliases expand to more than {MAX_EXPANDED} values; a configuration file "
                                   "needs far fewer")
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
            except TypeError:  # an unhashable key: SafeLoader says so below
                break
            if twice:
                raise self._fail(key_node, f"key {key!r} appears twice in one mapping; keep one (YAML keeps the "
                                           "last silently)")
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag not in (
    "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")] for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _expanded(node, sizes: dict) -> int:
    """The nodes NODE stands for once every alias is expanded (an alias is the same node object again):
    each distinct node's size is computed once, so this is linear in the document, however it expands."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = 1  # a node reached again while its own size is computed (a recursive alias) counts once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded(k, sizes) + _expanded(v, sizes) for k, v in node.value)
    sizes[key] = min(total, MAX_EXPANDED + 1)
    return sizes[key]


def read_text(path: Path) -> str:
    """The file's text, bounded; FileNotFoundError stays itself (Invoke tries each suffix and skips
    the missing), anything else is a ConfigFileError."""
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise
    except FileReadError as e:
        raise ConfigFileError(f"{path}: the file {e}; give a YAML, JSON or .py configuration file of at most "
                              f"{MAX_BYTES >> 10} KiB") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigFileError(f"{path}: cannot read it as UTF-8 text ({e}); fix or remove that file") from None
    if "\ufeff" in text[1:]:
        line = text[:text.index("\ufeff", 1)].count("\n") + 1
        raise ConfigFileError(f"{path}: line {line}: a byte-order mark inside the text (only the very start may "
                              "have one: a YAML reader would drop what follows it); remove it")
    return text


def load_json(path) -> object:
    """The data of the JSON file at PATH (strict: no duplicate keys, no NaN), bounded as YAML files are."""
    from runtime import strict_json
    text = read_text(Path(path))
    try:
        return strict_json.loads(text)
    except ValueError as e:
        raise ConfigFileError(f"{path}: not valid JSON ({' '.join(str(e).split())[:300]}); fix or remove that file") \
            from None
    except RecursionError:
        raise ConfigFileError(f"{path}: nested too deep; fix or remove that file") from None


def load_yaml(path) -> object:
    """The data of the YAML file at PATH, read within the bounds above; ConfigFileError otherwise."""
    source = str(path)
    text = read_text(Path(path))
    loader = _Loader(text, source)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())[:300]
        raise ConfigFileError(f"{source}: not valid YAML ({detail}); fix or remove that file") from None
    except RecursionError:
        raise ConfigFileError(f"{source}: nested too deep; fix or remove that file") from None
    finally:
        loader.dispose()
