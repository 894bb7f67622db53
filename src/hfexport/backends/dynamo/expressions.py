"""The two kinds of Python expression text a `.pt2` carries, parsed against a fixed grammar
rather than evaluated: size expressions (`is_size_expression`) and guards (`is_guard`).

# NOTE: torch 2.13 turns both into running code (read in torch/_export/serde/serialize.py
# `_parse_sym_expr` and torch/export/_unlift.py `_convert_guards_code_to_fn`): a symbolic size's
# `expr_str` goes to `sympy.sympify`, which `eval`s it, and each of `guards_code` is pasted into the
# source of a function that `exec` defines and the loaded module calls before every run. So the
# text is parsed with `ast` and accepted only when every node is one the grammar lists: calls of a
# fixed table of names with literal arguments, integer arithmetic and comparisons. No name is
# looked up anywhere, so a table of sympy classes cannot grow by a sympy upgrade. The tables are
# what torch prints for the programs hfexport exports (every expression of the tiny presets'
# programs, `tests/backends/dynamo/test_expressions.py`).
"""

from __future__ import annotations

import ast
import re

__all__ = ["is_size_expression", "is_guard"]

#: A size symbol, as torch names a backed size (`s70`).
_SYMBOL = re.compile(r"s[0-9]+")
#: The sympy calls `srepr` prints for sizes in hfexport's programs, with how many arguments each
#: takes (None: two or more). Symbol and Integer are checked apart.
_SIZE_CALLS = {"Add": None, "Mul": None, "Max": None, "Min": None, "Pow": 2, "FloorDiv": 2, "Mod": 2}
#: The only keyword arguments: how torch declares a size symbol.
_SYMBOL_KEYWORDS = [("positive", True), ("integer", True)]


def _is_int(node: ast.AST) -> bool:
    """An integer literal, possibly negative (`Integer(-32)` parses as minus a literal)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_size(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    name, args, keywords = node.func.id, node.args, node.keywords
    if name == "Symbol":
        return (len(args) == 1 and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)
                and bool(_SYMBOL.fullmatch(args[0].value)) and _keywords(keywords) == _SYMBOL_KEYWORDS)
    if name == "Integer":
        return len(args) == 1 and _is_int(args[0]) and not keywords
    if name not in _SIZE_CALLS or keywords:
        return False
    arity = _SIZE_CALLS[name]
    return (len(args) >= 2 if arity is None else len(args) == arity) and all(_is_size(arg) for arg in args)


def _keywords(keywords: list[ast.keyword]) -> list[tuple[str | None, bool]]:
    return [(k.arg, isinstance(k.value, ast.Constant) and k.value.value is True) for k in keywords]


def is_size_expression(text: str) -> bool:
    """Whether `text` (an `expr_str`) is one of the size expressions torch prints for hfexport's
    programs: `Symbol('s0', positive=True, integer=True)`, `Integer(n)`, and `Add`, `Mul`, `Max`,
    `Min` (two or more arguments), `Pow`, `FloorDiv`, `Mod` (two) of those."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _is_size(tree.body)


#: What a guard's text may hold. None of `#`, `;`, a newline, `"` or `\`: torch pastes the text
#: into generated source, and torch's own rewriting of it (`L['x']` to `args[0]`) replaces text.
_GUARD_CHARACTERS = re.compile(r"[A-Za-z0-9_ ()\[\]'.*+\-<>=!/%,]*")
#: The keys a guard reads its inputs by (`L['past_key_values']['0.keys']`).
_GUARD_KEY = re.compile(r"[A-Za-z0-9_.]+")
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)


def _is_input(node: ast.AST) -> bool:
    """`L['name']['key']...`: an input of the program, by name."""
    while isinstance(node, ast.Subscript):
        key = node.slice
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and _GUARD_KEY.fullmatch(key.value)):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


def _is_guard_term(node: ast.AST) -> bool:
    if _is_int(node):
        return True
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _ARITHMETIC) and _is_guard_term(node.left) and _is_guard_term(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _is_guard_term(node.operand)
    if isinstance(node, ast.Call):  # min(a, b), max(a, b)
        return (isinstance(node.func, ast.Name) and node.func.id in ("min", "max") and len(node.args) >= 2
                and not node.keywords and all(_is_guard_term(arg) for arg in node.args))
    # an input's size: L['x'].size()[i]
    return (isinstance(node, ast.Subscript) and _is_int(node.slice) and isinstance(node.value, ast.Call)
            and not node.value.args and not node.value.keywords and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "size" and _is_input(node.value.func.value))


def _is_guard_test(node: ast.AST) -> bool:
    if isinstance(node, ast.BoolOp):
        return all(_is_guard_test(value) for value in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _is_guard_test(node.operand)
    return (isinstance(node, ast.Compare) and all(isinstance(op, _COMPARISONS) for op in node.ops)
            and all(_is_guard_term(term) for term in (node.left, *node.comparators)))


def is_guard(text: str) -> bool:
    """Whether `text` (one of a program's `guards_code`) is a test on its inputs' sizes, as torch
    prints one: comparisons (and `and`, `or`, `not` of them) of integer arithmetic, `min`/`max`,
    and sizes `L['x'].size()[i]` of inputs named by plain keys."""
    if not _GUARD_CHARACTERS.fullmatch(text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _is_guard_test(tree.body)
