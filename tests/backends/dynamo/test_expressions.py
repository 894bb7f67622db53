"""The size-expression and guard grammars (`backends/dynamo/expressions.py`): every expression and
guard in real programs of several presets parses; text reaching anything else is refused; and
what the grammar accepts, sympy builds from the table's classes only."""

from __future__ import annotations

import json
import zipfile

import pytest
import sympy
import torch.utils._sympy.functions as size_functions
from hypothesis import given, settings
from hypothesis import strategies as st

from hfexport import DynamoConfig, DynamoExporter
from hfexport.backends.dynamo.artifact import write_program
from hfexport.backends.dynamo.expressions import is_guard, is_size_expression
from hfexport.presets import build_preset


def _texts(path) -> tuple[list[str], list[str]]:
    """Every `expr_str` and every guard of the `.pt2` at `path`."""
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        tree = json.loads(archive.read(f"{root}/models/model.json"))
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                found.append(value) if key == "expr_str" else walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return found, tree["guards_code"]


@pytest.fixture(scope="module")
def real_programs(saved_generation, dynamic_llama, tmp_path_factory):
    """`.pt2` files hfexport wrote: the generation exports of Llama (prefill and decode over a
    dynamic cache), static-cache Llama and T5 (encoder-decoder), and dynamic exports of Llama,
    Qwen3 and GPT-2."""
    files = [path for case in ("llama", "llama-static", "t5")
             for path in sorted(saved_generation("dynamo", case).directory.glob("*.pt2"))]
    folder = tmp_path_factory.mktemp("grammar")
    files.append(write_program(dynamic_llama("dynamo")[2], folder / "llama.pt2"))
    for name in ("qwen3", "gpt2"):
        model, inputs = build_preset(name)
        program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
        files.append(write_program(program, folder / f"{name}.pt2"))
    return files


def test_every_expression_and_guard_of_real_programs_parses(real_programs):
    calls = set()
    for path in real_programs:
        expressions, guards = _texts(path)
        assert expressions, f"{path} has no symbolic size: the check would be vacuous"
        refused = [text for text in expressions if not is_size_expression(text)]
        refused += [text for text in guards if not is_guard(text)]
        assert not refused, f"{path.parent.name}/{path.name}: {refused[:3]}"
        calls.update(name for text in expressions for name in ("Mul", "Add", "FloorDiv", "Max") if name in text)
    # the programs exercise more than bare symbols
    assert calls >= {"Mul", "Add"}
    assert any(_texts(path)[1] for path in real_programs)


_SYMBOL = "Symbol('s0', positive=True, integer=True)"


@pytest.mark.parametrize("text", [
    "Function('f')(Symbol('s0', positive=True, integer=True))",
    "Lambda(Symbol('s0', positive=True, integer=True), Integer(1))",
    "__import__('os').system('true')",
    "Symbol('s0')",  # not how torch declares a size
    "Symbol('x', positive=True, integer=True)",
    "Symbol('s0', positive=True, integer=True, commutative=False)",
    "Symbol('s0', positive=1, integer=True)",
    "Symbol(name='s0', positive=True, integer=True)",
    "Integer(True)",
    "Integer('2')",
    "Float('0.5', precision=53)",
    "Rational(1, 2)",
    f"Mul({_SYMBOL})",  # Mul of one
    f"Pow({_SYMBOL}, Integer(2), Integer(3))",
    f"Add({_SYMBOL}, 1)",  # a bare literal: srepr never prints one
    f"Mul(*[{_SYMBOL}, {_SYMBOL}])",
    f"{_SYMBOL}.func",
    f"Integer(2) * {_SYMBOL}",
    "sympify('1')",
    "Max.__subclasses__()",
    "Integer(1 if True else 2)",
    "",
    "Integer(",
])
def test_a_size_expression_outside_the_grammar_is_refused(text):
    assert not is_size_expression(text)


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",
    "L['x'].size()[0] == 1 or __import__('os')",
    "L['x'].size()[0] == 1 and L['x'].__class__",
    'L["x"].size()[0] == 1',
    "L['x'].size()[0] == 1 # a comment",
    "L['x'].size()[0] == 1\nimport os",
    "L['x'].size()[0] == 1; x",
    "L['a b'].size()[0] == 1",
    "L['x'].size(0) == 1",
    "M['x'].size()[0] == 1",
    "L.x.size()[0] == 1",
    "abs(L['x'].size()[0]) == 1",
    "L['x'].size()[0] == 1.5",
    "L['x'].size()[0] ** 2 == 1",
    "L['x'].size()[0]",  # not a test
    "min(L['x'].size()[0]) == 1",
    "(lambda: 1)() == 1",
    "L['x'].size()[L['y'].size()[0]] == 1",
])
def test_a_guard_outside_the_grammar_is_refused(text):
    assert not is_guard(text)


def test_guards_as_torch_prints_them_parse():
    for text in ["L['input_ids'].size()[1] == L['position_ids'].size()[1]",
                 "0 <= L['past_key_values']['0.values'].size()[2] + ((-1)*L['attention_mask'].size()[3])",
                 "L['token_type_ids'].size()[1] == min(128, L['token_type_ids'].size()[1])",
                 "((32*L['hidden_states'].size()[0]) % 128) == 0",
                 "(32*L['hidden_states'].size()[0]) == (128*(L['hidden_states'].size()[0] // 4))",
                 "L['x'].size()[0] >= 2 and L['x'].size()[0] != 3"]:
        assert is_guard(text), text


#: What torch's deserializer evaluates an `expr_str` against (its `sympy_functions` for the names
#: the grammar allows; sympy's namespace for the rest), as read in torch 2.13's serialize.py.
_LOCALS = {"FloorDiv": size_functions.FloorDiv, "Mod": size_functions.Mod}
_TABLE_CLASSES = (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul, sympy.Pow, sympy.Max, sympy.Min,
                  size_functions.FloorDiv, size_functions.Mod)


def _sizes() -> st.SearchStrategy:
    """Random size arithmetic over the table's operations, as sympy objects."""
    symbols = st.integers(0, 5).map(lambda i: sympy.Symbol(f"s{i}", positive=True, integer=True))
    integers = st.integers(-64, 64).map(sympy.Integer)

    def extend(children):
        pair = st.tuples(children, children)
        return st.one_of(pair.map(lambda p: sympy.Add(*p)), pair.map(lambda p: sympy.Mul(*p)),
                         pair.map(lambda p: sympy.Max(*p)), pair.map(lambda p: sympy.Min(*p)),
                         st.tuples(children, st.integers(2, 3)).map(lambda p: sympy.Pow(p[0], p[1])),
                         st.tuples(children, symbols).map(lambda p: size_functions.FloorDiv(*p)),
                         st.tuples(children, symbols).map(lambda p: size_functions.Mod(*p)))

    return st.recursive(st.one_of(symbols, integers), extend, max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(_sizes())
def test_size_arithmetic_torch_prints_round_trips(expression):
    """Whatever arithmetic of the table's operations torch prints (`srepr`, as its serializer does)
    is accepted, and evaluates back to the same expression."""
    text = sympy.srepr(expression)
    if any(not isinstance(node, _TABLE_CLASSES) for node in sympy.preorder_traversal(expression)):
        return  # sympy simplified into another class (a Rational, ...): not a size torch prints
    assert is_size_expression(text), text
    # sympify evaluates what it builds; a drawn expression may hold an unevaluated part (hypothesis
    # drew `Min(s2, Max(2, 3))`, which reads back as `Min(3, s2)`): the same expression, evaluated
    assert sympy.sympify(text, locals=_LOCALS) in (expression, expression.doit())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="SymbolIntegerAddMulFloorDivPowMaxMin()',=0123456789s_ Truepositvg.-*+", max_size=80))
def test_what_the_grammar_accepts_builds_only_the_table_s_classes(text):
    """No accepted text reaches anything but the table's classes when sympify evaluates it."""
    if not is_size_expression(text):
        return
    built = sympy.sympify(text, locals=_LOCALS)
    assert all(isinstance(node, _TABLE_CLASSES) for node in sympy.preorder_traversal(built))


def test_the_grammar_refuses_every_other_sympy_and_torch_size_class():
    """A fixed table, not "any sympy class": each class sympify could reach by name, called as the
    table's are, is refused unless the table lists it."""
    table = {"Symbol", "Integer", "Add", "Mul", "Max", "Min", "Pow", "FloorDiv", "Mod"}
    names = {name for name in dir(sympy) + dir(size_functions) if isinstance(
        getattr(sympy, name, None) or getattr(size_functions, name, None), type)} - table
    assert {"Function", "Lambda", "Float", "CeilToInt", "PythonMod", "Piecewise"} <= names
    for name in names:
        assert not is_size_expression(f"{name}({_SYMBOL}, {_SYMBOL})"), name
        assert not is_size_expression(f"{name}({_SYMBOL})"), name
