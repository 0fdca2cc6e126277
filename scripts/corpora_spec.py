"""What the Python checks of scripts/lint-corpora.sh share when they read a spec on their own
(independently of idem-lint): the non-safe methods, JSON-pointer escaping, and following local
`$ref`s."""

NON_SAFE = ("post", "put", "patch", "delete")


def esc(s):
    """A path as one JSON-pointer segment."""
    return s.replace("~", "~0").replace("/", "~1")


def resolve(doc, node):
    """`node` with its local `$ref`s followed (at most 64; None for a longer chain or a cycle)."""
    for _ in range(64):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/")):
            return node
        cur = doc
        for seg in node["$ref"][2:].split("/"):
            cur = cur[seg.replace("~1", "/").replace("~0", "~")]
        node = cur
    return None
