"""NeMo's YAML as NeMo reads it (OmegaConf's numbers and ``${...}`` interpolations), safely.

:func:`load_nemo_yaml` decodes a file with the safe loader (:func:`manifests.validation.load_yaml_file`:
plain data only, aliases bounded) plus OmegaConf's float grammar (``6e-1`` is a float) and its
refusal of repeated keys, then resolves OmegaConf interpolations in every string, as
``OmegaConf.to_container(resolve=True)`` does: ``${oc.env:VAR}`` / ``${oc.env:VAR,default}`` (a
string; a ``null`` default gives null), ``${oc.decode:...}`` (a number, bool, null or string),
``${oc.select:key,default}``, references within the file (``${a.b[0]}``, relative ``${.b}``),
and ``\\${`` for a literal ``${``. A string that is exactly one interpolation takes the value's
type; text around one makes a string. Other resolvers, cycles, missing keys or variables and a
string resolving to over :data:`MAX_RESOLVED_CHARS` characters are one-line errors naming the
file and the key. No code runs: no resolver is looked up by name outside this module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from manifests.errors import ManifestError
from manifests.validation import load_yaml_file

#: longest string an interpolation may produce (a few KiB in any real config)
MAX_RESOLVED_CHARS = 1 << 20
#: OmegaConf's float grammar (omegaconf._utils.get_yaml_loader): YAML 1.1 floats plus ``1e-3``
FLOAT_RE = re.compile(r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.VERBOSE)
_INT_RE = re.compile(r"[-+]?(?:\d+(?:_\d+)*)")
_GRAMMAR_FLOAT = re.compile(r"[-+]?(?:\d+(?:_\d+)*\.\d*(?:_\d+)*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|"
                            r"\d+(?:_\d+)*[eE][-+]?\d+|inf|nan)", re.IGNORECASE)
_RESOLVER = re.compile(r"\s*([A-Za-z_][\w.]*)\s*:")


def _loader() -> type:
    import yaml

    class NemoLoader(yaml.SafeLoader):
        """The safe loader with OmegaConf's floats and its refusal of a repeated key."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:str" or key_node.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    if key_node.value in keys:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key_node.value!r} appears twice (line {key_node.start_mark.line + 1})",
                            key_node.start_mark)
                    keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    NemoLoader.yaml_implicit_resolvers = {  # OmegaConf's: no timestamps (a date stays a string)
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    NemoLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_RE, list("-+0123456789."))
    return NemoLoader


def load_nemo_yaml(path: str | os.PathLike[str], missing: str = "no such file") -> Any:
    """A YAML file as NeMo (OmegaConf) reads it, interpolations resolved (module docstring)."""
    data = load_yaml_file(path, missing, loader=_loader())
    return _Resolver(str(path), data).value(())


def _key_text(path: tuple[Any, ...]) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(file)"


class _Resolver:
    """Resolves every string of ``root`` once (memoized by key path; a path met again while being
    resolved is a cycle)."""

    def __init__(self, where: str, root: Any) -> None:
        self.where, self.root = where, root
        self.done: dict[tuple[Any, ...], Any] = {}
        self.busy: set[tuple[Any, ...]] = set()

    def fail(self, path: tuple[Any, ...], problem: str) -> ManifestError:
        return ManifestError(f"{self.where}: {_key_text(path)}: {problem}")

    def raw(self, path: tuple[Any, ...]) -> Any:
        node = self.root
        for k in path:
            node = node[k]
        return node

    def value(self, path: tuple[Any, ...]) -> Any:
        """The resolved value at ``path`` (containers resolved throughout)."""
        if path in self.done:
            return self.done[path]
        if path in self.busy:
            raise self.fail(path, "an interpolation refers back to itself (a cycle)")
        self.busy.add(path)
        node = self.raw(path)
        if isinstance(node, dict):
            out: Any = {k: self.value((*path, k)) for k in node}
        elif isinstance(node, list):
            out = [self.value((*path, i)) for i in range(len(node))]
        elif isinstance(node, str) and "${" in node:
            out = _Text(self, path, node).whole()
        else:
            out = node
        self.busy.discard(path)
        self.done[path] = out
        return out

    def lookup(self, at: tuple[Any, ...], key: str, default: Any = ...) -> Any:
        """The value of a reference ``key`` written at ``at`` (absolute ``a.b[0]``, relative ``.b``)."""
        key = key.strip()
        dots = len(key) - len(key.lstrip("."))
        if dots:
            base = at[:-1]
            if dots - 1 > len(base):
                raise self.fail(at, f"${{{key}}}: goes above the top of the file")
            base = base[:len(base) - (dots - 1)]
            key = key[dots:]
        else:
            base = ()
        path = list(base)
        for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", key):
            path.append(int(part[1:-1]) if part.startswith("[") and part[1:-1].strip().isdigit()
                        else part.strip("[]").strip())
        node, resolved = self.root, False
        for i, k in enumerate(path):
            if not resolved and isinstance(node, str) and "${" in node:  # through an interpolation, as OmegaConf
                node, resolved = self.value(tuple(path[:i])), True
            if isinstance(node, list) and isinstance(k, str) and k.isdigit():
                k = path[i] = int(k)
            ok = (isinstance(node, dict) and k in node) or (isinstance(node, list) and isinstance(k, int)
                                                            and 0 <= k < len(node))
            if not ok:
                if default is not ...:
                    return default
                raise self.fail(at, f"${{{key if not dots else '.' * dots + key}}}: no such key in the file")
            node = node[k]
        return node if resolved else self.value(tuple(path))


class _Text:
    """One string holding interpolations: a small parser of OmegaConf's grammar."""

    def __init__(self, r: _Resolver, path: tuple[Any, ...], text: str) -> None:
        self.r, self.path, self.s = r, path, text

    def fail(self, problem: str) -> ManifestError:
        return self.r.fail(self.path, f"{problem} (in {self.s[:80]!r})")

    def whole(self) -> Any:
        parts = self.parts(self.s)
        if len(parts) == 1 and isinstance(parts[0], tuple):
            return self.interp(parts[0][1])
        return self.join(parts)

    def join(self, parts: list[Any]) -> str:
        out = "".join(p if isinstance(p, str) else str(self.interp(p[1])) for p in parts)
        if len(out) > MAX_RESOLVED_CHARS:
            raise self.fail(f"resolves to over {MAX_RESOLVED_CHARS:,} characters; refused")
        return out

    def parts(self, s: str) -> list[Any]:
        """``s`` as literal strings and ``("${", body)`` interpolations."""
        parts: list[Any] = []
        i, lit = 0, ""
        while i < len(s):
            if s.startswith("\\\\${", i):  # an escaped backslash before an interpolation
                lit, i = lit + "\\", i + 2
            elif s.startswith("\\${", i):
                lit, i = lit + "${", i + 3
            elif s.startswith("${", i):
                end = self.close(s, i + 2)
                if lit:
                    parts.append(lit)
                parts.append(("${", s[i + 2:end]))
                lit, i = "", end + 1
            else:
                lit, i = lit + s[i], i + 1
        if lit:
            parts.append(lit)
        return parts

    def close(self, s: str, i: int) -> int:
        """The index of the ``}`` closing an interpolation whose body starts at ``i``."""
        depth, quote = 0, ""
        while i < len(s):
            c = s[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif s.startswith("${", i):
                depth, i = depth + 1, i + 1
            elif c in "[{":
                depth += 1
            elif c in "]}":
                if depth == 0 and c == "}":
                    return i
                depth -= 1
            i += 1
        raise self.fail("an interpolation '${' is not closed")

    def interp(self, body: str) -> Any:
        m = _RESOLVER.match(body)
        if not m:
            if "${" in body:
                raise self.fail("a nested interpolation as a key is not read")
            return self.r.lookup(self.path, body)
        name, args = m.group(1), self.args(body[m.end():])
        if name == "oc.env":
            if not 1 <= len(args) <= 2 or not isinstance(args[0], str):
                raise self.fail("oc.env takes a variable name and an optional default")
            if args[0] in os.environ:
                return os.environ[args[0]]
            if len(args) == 2:
                return None if args[1] is None else str(args[1])
            raise self.fail(f"environment variable {args[0]!r} is not set (and no default is given)")
        if name == "oc.decode":
            if len(args) != 1 or not (args[0] is None or isinstance(args[0], str)):
                raise self.fail("oc.decode takes one string")
            return None if args[0] is None else self.element(args[0])
        if name == "oc.select":
            if not 1 <= len(args) <= 2 or not isinstance(args[0], str):
                raise self.fail("oc.select takes a key and an optional default")
            return self.r.lookup(self.path, args[0], args[1] if len(args) == 2 else None)
        raise self.fail(f"resolver {name!r} is not read (oc.env, oc.decode and oc.select are)")

    def args(self, s: str) -> list[Any]:
        """Resolver arguments split at top-level commas, each decoded as OmegaConf's grammar does."""
        out, depth, quote, start, i = [], 0, "", 0, 0
        while i < len(s):
            c = s[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "[{" or s.startswith("${", i):
                depth += 1
                i += c == "$"
            elif c in "]}":
                depth -= 1
            elif c == "," and depth == 0:
                out.append(s[start:i])
                start = i + 1
            i += 1
        out.append(s[start:])
        return [self.element(a.strip()) for a in out] if s.strip() else []

    def element(self, a: str) -> Any:
        """One value of OmegaConf's grammar: quoted string, null, bool, int, float, interpolations, text."""
        if len(a) >= 2 and a[0] == a[-1] and a[0] in "'\"":
            inner = re.sub(r"\\(.)", r"\1", a[1:-1])
            return self.join(self.parts(inner)) if "${" in inner else inner
        if a.startswith(("[", "{")):
            raise self.fail("a list or mapping inside an interpolation is not read")
        low = a.lower()
        if low == "null":
            return None
        if low in ("true", "false"):
            return low == "true"
        if _INT_RE.fullmatch(a):
            return int(a.replace("_", ""))
        if _GRAMMAR_FLOAT.fullmatch(a):
            return float(a.replace("_", ""))
        parts = self.parts(a)
        if len(parts) == 1 and isinstance(parts[0], tuple):
            return self.interp(parts[0][1])
        return self.join(parts)


def yaml_path(base: str | os.PathLike[str], name: str) -> Path:
    """``name`` (a nested ``input_cfg`` file) as a path: relative ones against ``base``'s folder."""
    p = Path(name).expanduser()
    return p if p.is_absolute() else Path(base).parent / p
