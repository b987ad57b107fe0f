"""How a chat template's operations spend its rendering's budget (template_budget.py).

Most operations make a value no larger than their inputs put together, and are checked on their
result. Those that multiply a size in one step are checked before they run, from their
arguments: `*` and `**`, `%` and `.format` (a width in the format), `+` of two sequences, the
filters and methods join, replace, indent, wordwrap, sum, expandtabs, and any whole-number
argument larger than the size bound (center(10**9), batch(10**9)); the text Jinja joins for a
macro or a block is counted as it is joined (`joined`). The template's code is rewritten once,
at compile time (`bound_tree`), so that each loop spends a step per iteration and its literal
lists, tuples and dicts and its `~` are checked. Jinja's constant folding is off: it would run
filters of constants at compile time, outside any budget.
"""

from __future__ import annotations

import re
from functools import wraps
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, pass_context
from jinja2.visitor import NodeTransformer

from sheepop.tokenizers.template_budget import (
    MAX_INT_BITS,
    Budget,
    RenderLimit,
    current,
    joined,
)

# ----- what each operation may make ---------------------------------------------------------------

_SPEC = re.compile(r"%[^a-zA-Z%]*|\{[^{}]*\}")  # a %-conversion's flags, a {} field
_NUMBER = re.compile(r"[0-9]+")


def check_format(fmt: str) -> None:
    """A format's widths within the rendering's bounds (for a function that formats)."""
    b = current()
    if b is not None:
        _check_format(b, fmt, ())


def _check_format(b: Budget, fmt: str, args: Any) -> None:
    """A format's widths and precisions (written in it, or given as arguments) within bounds."""
    for spec in _SPEC.findall(fmt):
        for digits in _NUMBER.findall(spec):
            b.allow(int(digits) if len(digits) < 12 else b.chars + 1)
    _check_ints(b, args if isinstance(args, (tuple, list)) else (args,))


def _check_ints(b: Budget, values: Any) -> None:
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            b.allow(abs(v))


def _check_binop(b: Budget, op: str, left: Any, right: Any) -> None:
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
    if op == "**" and ints and right > 0 and abs(left) > 1:
        if right * left.bit_length() > MAX_INT_BITS:
            raise RenderLimit(f"it computed a number of more than {MAX_INT_BITS} bits")
    elif op == "*" and ints:
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise RenderLimit(f"it computed a number of more than {MAX_INT_BITS} bits")
    elif op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and not isinstance(seq, (int, float)):
            b.allow(b.size(seq) * max(n, 0))
    elif op == "+" and not isinstance(left, (int, float)):
        b.allow(b.size(left) + b.size(right))
    elif op == "%" and isinstance(left, str):
        _check_format(b, left, right)


def _check_join(b: Budget, items: list[Any], sep: str) -> None:
    b.allow(sum(b.size(x) for x in items) + max(len(items) - 1, 0) * len(sep))


def _check_replace(b: Budget, text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        b.allow(len(text) + (len(text) // max(len(old), 1) + 1) * len(new))


def _filter_checks(b: Budget, name: str, value: Any, args: tuple, kwargs: dict) -> tuple:
    """The checks of the filters that multiply a size; (value, args) to call it with (an
    iterable joined or summed is made a list first, so that it is read once)."""
    arg = lambda i, key, default=None: (args[i] if len(args) > i  # noqa: E731
                                        else kwargs.get(key, default))
    if name in ("join", "sum"):
        value = list(value) if not isinstance(value, (str, list, tuple)) else value
        if name == "join":
            _check_join(b, list(value), str(arg(0, "d", "")))
        elif not isinstance(arg(1, "start", 0), (int, float)):
            b.allow(b.size(arg(1, "start")) + sum(b.size(x) for x in value))
    elif name == "replace":
        _check_replace(b, str(value), arg(0, "old"), arg(1, "new"))
    elif name == "indent":
        width = arg(0, "width", 4)
        width = len(width) if isinstance(width, str) else width
        if isinstance(width, int):
            b.allow(len(str(value)) + (str(value).count("\n") + 1) * width)
    elif name == "wordwrap":
        b.allow(len(str(value)) * (1 + len(str(arg(2, "wrapstring", "\n") or "\n"))))
    elif name == "format" and isinstance(value, str):
        _check_format(b, value, args)
    return value, args


def bounded_filter(name: str, func: Any) -> Any:
    """`func`, the filter `name`, spending the rendering's budget and checked (module
    docstring). It takes the context, which makes it no constant: Jinja would otherwise run a
    filter of constants at compile time, outside any budget ("x"|center(10**9))."""
    passes = _PassArg.from_obj(func)

    @pass_context
    @wraps(func)
    def bounded(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        first = {_PassArg.context: (context,), _PassArg.eval_context: (context.eval_ctx,),
                 _PassArg.environment: (context.environment,)}.get(passes, ())
        b = current()
        if b is None:
            return func(*first, value, *args, **kwargs)
        b.step()
        _check_ints(b, args)
        _check_ints(b, kwargs.values())
        value, args = _filter_checks(b, name, value, args, kwargs)
        return b.checked(func(*first, value, *args, **kwargs))
    return bounded


def _check_method(b: Budget, obj: Any, args: tuple) -> tuple:
    """A str method's check before it runs; the arguments to call it with."""
    target = getattr(obj, "__self__", getattr(getattr(obj, "__wrapped__", None), "__self__",
                                               None))
    if not isinstance(target, str):
        return args
    name = getattr(obj, "__name__", "")
    if name == "join" and args:
        items = list(args[0])
        _check_join(b, items, target)
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2:
        _check_replace(b, target, args[0], args[1])
    elif name in ("format", "format_map"):
        _check_format(b, target, args)
    elif name == "expandtabs":
        tab = args[0] if args and isinstance(args[0], int) else 8
        b.allow(len(target) + target.count("\t") * tab)
    return args


def _counted(b: Budget, iterable: Any):
    for item in iterable:
        b.step()
        yield item


@pass_context
def _steps(context: Any, iterable: Any) -> Any:
    """A loop's iterable, one step spent per iteration."""
    b = current()
    return iterable if b is None else _counted(b, iterable)


@pass_context
def _sized(context: Any, value: Any) -> Any:
    """A literal list, tuple or dict, or a `~` concatenation, checked."""
    b = current()
    return value if b is None else b.checked(value)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, whose calls, operators and joins spend the budget."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})
    concat = staticmethod(joined)  # type: ignore[assignment]

    def __init__(self, **options: Any):
        # (no constant folding: Jinja's optimizer runs filters at compile time, outside any
        # budget, and "x"|center(10**9) is a constant)
        super().__init__(**options, optimized=False)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters.update(_sheepop_steps=_steps, _sheepop_sized=_sized)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = current()
        if b is not None:
            _check_binop(b, operator, left, right)
        result = super().call_binop(context, operator, left, right)
        return result if b is None else b.checked(result)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = current()
        if b is None:
            return super().call(__context, __obj, *args, **kwargs)
        b.step()
        _check_ints(b, args)
        _check_ints(b, kwargs.values())
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (_counted(b, args[0]), *args[1:])
        args = _check_method(b, __obj, args)
        return b.checked(super().call(__context, __obj, *args, **kwargs))


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Bounding(NodeTransformer):
    """The rewrite `bound_tree` makes."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = _filtered(node.iter, "_sheepop_steps")
        return node

    def _sized(self, node: nodes.Expr) -> nodes.Expr:
        self.generic_visit(node)
        return _filtered(node, "_sheepop_sized")

    visit_List = visit_Dict = visit_Concat = _sized

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        return self._sized(node) if node.ctx == "load" else self.generic_visit(node)


def bound_tree(tree: nodes.Template, environment: jinja2.Environment) -> nodes.Template:
    """A parsed template whose loops spend a step per iteration and whose literal lists,
    tuples, dicts and `~` concatenations are checked for size."""
    tree = _Bounding().visit(tree)
    tree.set_environment(environment)
    return tree
