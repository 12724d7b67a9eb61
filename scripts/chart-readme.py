#!/usr/bin/env python3
"""Regenerate the values table of charts/leasehold/README.md from values.yaml.

Every value in values.yaml carries a `# --` comment directly above it (continued by
further `#` lines); a commented mapping is one row whose default is the whole mapping.
Types come from values.schema.json, which must know every row. The table replaces the
text between the README's `<!-- values:begin -->` and `<!-- values:end -->` markers.

    scripts/chart-readme.py          rewrite the README
    scripts/chart-readme.py --check  fail (with a diff) if the README is out of date

Python 3 standard library only, so it reads the YAML subset values.yaml is written in:
block mappings, JSON-style flow collections (`[]`, `{}`, `["ALL"]`) and plain, quoted
or null scalars. Anything else is an error rather than a wrong table.
"""

import difflib
import json
import re
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parent.parent / "charts" / "leasehold"
BEGIN, END = "<!-- values:begin -->", "<!-- values:end -->"
TYPE_NAMES = {"integer": "int", "number": "float", "boolean": "bool", "array": "list"}

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?: +(?P<value>.*))?$")
DOC = re.compile(r"^(?P<indent> *)# -- ?(?P<text>.*)$")
COMMENT = re.compile(r"^(?P<indent> *)#(?: (?P<text>.*))?$")


class Node:
    """A key of values.yaml: its `# --` text, and an inline value or child keys."""

    def __init__(self, path, doc):
        self.path, self.doc, self.value, self.inline, self.children = path, doc, None, False, []

    def default(self):
        if not self.children:
            return self.value
        return {c.path[-1]: c.default() for c in self.children}


def fail(lineno, msg):
    sys.exit(f"values.yaml:{lineno}: {msg}")


def scalar(text, lineno):
    """An inline value: a JSON-style flow collection or string, or a plain scalar."""
    if text[0] in "[{\"":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            fail(lineno, f"not JSON-style flow YAML: {text}")
    if text[0] == "'" or " #" in text or text[0] in "&*!|>%@`":
        fail(lineno, f"unsupported YAML here: {text}")
    if text in ("null", "~"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    return text


def parse(lines):
    """The top-level Nodes of values.yaml."""
    root = Node((), None)
    stack = [(-1, root)]  # (indent, node) of the open mappings
    doc, doc_indent = None, None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            if doc is not None:
                fail(lineno, "a `# --` comment must sit directly above its key")
            continue
        if m := DOC.match(line):
            doc, doc_indent = [m["text"]], len(m["indent"])
            continue
        if m := COMMENT.match(line):
            if doc is not None and len(m["indent"]) == doc_indent:
                doc.append(m["text"] or "")
            continue
        m = KEY.match(line)
        if not m:
            fail(lineno, f"unsupported YAML: {line.strip()}")
        indent = len(m["indent"])
        if doc is not None and doc_indent != indent:
            fail(lineno, "a `# --` comment must be indented like its key")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if parent.inline:
            fail(lineno, f"{'.'.join(parent.path)} has a value and keys")
        node = Node(parent.path + (m["key"],), " ".join(doc).strip() if doc else None)
        if (m["value"] or "").strip():
            node.value, node.inline = scalar(m["value"].strip(), lineno), True
        parent.children.append(node)
        stack.append((indent, node))
        doc = None
    return root.children


def rows(nodes, documented_above=False):
    """(key, default, description) for every documented value, in file order."""
    for node in nodes:
        key = ".".join(node.path)
        if node.doc and documented_above:
            sys.exit(f"values.yaml: {key}: a `# --` comment inside the documented {key.rsplit('.', 1)[0]}")
        if node.doc:
            yield key, node.default(), node.doc
            list(rows(node.children, True))  # only to reject comments that would be lost
        elif node.children:
            yield from rows(node.children, documented_above)
        elif not documented_above:
            sys.exit(f"values.yaml: {key} has no `# --` comment")


def schema_type(schema, key):
    """The type names values.schema.json gives the value at `key`."""
    for part in key.split("."):
        schema = schema.get("properties", {}).get(part)
        if schema is None:
            sys.exit(f"values.schema.json does not describe {key}")
    alternatives = schema.get("oneOf") or schema.get("anyOf") or [schema]
    names = []
    for alt in alternatives:
        types = alt.get("type", [])
        for t in [types] if isinstance(types, str) else types:
            name = TYPE_NAMES.get(t, t)
            if t != "null" and name not in names:
                names.append(name)
    if not names:
        sys.exit(f"values.schema.json gives {key} no type")
    return " or ".join(names)


def schema_keys(schema, prefix=()):
    """Paths of the properties values.schema.json describes (not Helm's `global`)."""
    for name, sub in schema.get("properties", {}).items():
        if prefix or name != "global":
            yield prefix + (name,)
            yield from schema_keys(sub, prefix + (name,))


def cell(text):
    return text.replace("|", "\\|")


def table(values_text, schema):
    out = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    keys = set()
    for key, default, doc in rows(parse(values_text.splitlines())):
        keys.add(tuple(key.split(".")))
        shown = cell(json.dumps(default, ensure_ascii=False))
        out.append(f"| `{key}` | {schema_type(schema, key)} | `{shown}` | {cell(doc)} |")
    for path in schema_keys(schema):
        if not any(path[: len(k)] == k or k[: len(path)] == path for k in keys):
            sys.exit(f"values.schema.json describes {'.'.join(path)}, which values.yaml lacks")
    return "\n".join(out) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] and not check:
        sys.exit(__doc__)
    readme_path = CHART / "README.md"
    if not readme_path.exists():
        sys.exit(f"{readme_path} is missing (it holds the text around the generated table)")
    readme = readme_path.read_text(encoding="utf-8")
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    generated = table((CHART / "values.yaml").read_text(encoding="utf-8"), schema)
    try:
        head, rest = readme.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        sys.exit(f"{readme_path}: no {BEGIN} ... {END} section")
    wanted = f"{head}{BEGIN}\n{generated}{END}{tail}"
    if wanted == readme:
        return
    if check:
        diff = difflib.unified_diff(
            readme.splitlines(True), wanted.splitlines(True), "charts/leasehold/README.md", "generated"
        )
        sys.stderr.writelines(diff)
        sys.exit("charts/leasehold/README.md is out of date: run scripts/chart-readme.py")
    readme_path.write_text(wanted, encoding="utf-8")


if __name__ == "__main__":
    main()
