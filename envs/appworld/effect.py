"""The canonical effect of AppWorld code: what EMPO groups responses by.

"One Act, Many Masks: Effect-Marginal Policy Optimization for Long-Horizon Agents" (2026; EMPO,
docs/papers/empo.md) shares one importance ratio among responses of the same context that execute
the same canonical effect. On AppWorld a response is Python, and what it does to the world is the
API calls it makes, so `AppWorldEnv.step` reports `info["effect"] = code_effect(code)` (the env
contract, vcbm_gym/contract.py) and the trainer never parses code itself.
"""

from __future__ import annotations

import ast


class _ApiCalls(ast.NodeVisitor):
    """Calls on `apis.*` (AppWorld's API object) in source order, innermost arguments first."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        while isinstance(func, ast.Attribute):
            func = func.value
        if isinstance(func, ast.Name) and func.id == "apis":
            self.calls.append(ast.unparse(node))


def code_effect(code: str) -> str | None:
    """The `apis.<app>.<api>(...)` calls the code makes, each `ast.unparse`d (comments gone,
    whitespace, quotes and parentheses normalised) and joined by "; "; or None if it does not parse.

    Code with no API call (e.g. only prints) is normalised as a whole module with `ast.unparse`, so
    formatting-only differences still share an effect; blank code has none (None).
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    visitor = _ApiCalls()
    visitor.visit(tree)
    if visitor.calls:
        return "; ".join(visitor.calls)
    normalised = ast.unparse(tree)
    return normalised if normalised.strip() else None
