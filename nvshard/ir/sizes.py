"""Symbolic extents.

Extents are monomials: a rational coefficient times a product of symbols
(nvFuser's `i0`, `i1`, ...). That is enough to follow extents through
pointwise ops, permutes, reductions and most reshapes at definition time,
when input sizes are `-1`. Symbols that must be equal (two operands of an
add) are unified with a union-find, so later comparisons see one symbol.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Optional, Protocol, runtime_checkable


# Bumped whenever two extents are unified, so cached canonical forms of
# sizes (computed by the passes, thousands of times) know when to refresh.
_EPOCH = [0]


class Sym:
    """One symbolic extent. `definition` (a Scalar) computes it at run time
    when it is not an input extent."""

    def __init__(self, name: str, definition=None):
        self.name = name
        self.definition = definition
        self._parent: Sym = self
        self._static: Optional[int] = None

    def find(self) -> "Sym":
        root = self
        while root._parent is not root:
            root = root._parent
        node = self
        while node._parent is not root:
            node._parent, node = root, node._parent
        return root

    @property
    def static_value(self) -> Optional[int]:
        return self.find()._static

    def __repr__(self) -> str:
        return self.name


def unify_syms(a: Sym, b: Sym) -> None:
    ra, rb = a.find(), b.find()
    if ra is rb:
        return
    # Keep the older (lower-numbered) name as the representative: it prints as
    # the extent users defined first.
    if _sym_order(rb) < _sym_order(ra):
        ra, rb = rb, ra
    if ra._static is not None and rb._static is not None and ra._static != rb._static:
        raise ValueError(f"extents {ra} = {ra._static} and {rb} = {rb._static} must be equal")
    rb._parent = ra
    if ra._static is None:
        ra._static = rb._static
    _EPOCH[0] += 1


def _sym_order(s: Sym) -> tuple:
    digits = "".join(c for c in s.name if c.isdigit())
    return (0 if s.definition is None else 1, int(digits) if digits else 0, s.name)


# Fractions of the ints sizes are made from (block sizes, mesh sizes), made
# once: Fraction is pure Python, and making one costs as much as a dozen
# dict lookups. Fractions are immutable, so sharing them is safe.
_FRACTIONS: dict = {}


def _fraction(value) -> Fraction:
    if type(value) is not int:
        return Fraction(value)
    known = _FRACTIONS.get(value)
    if known is None:
        known = Fraction(value)
        if len(_FRACTIONS) < 4096:
            _FRACTIONS[value] = known
    return known


class Size:
    """coef * prod(syms). Immutable; compare with `same_as` or `==`."""

    __slots__ = ("coef", "syms", "_canonical", "_key", "_epoch")

    def __init__(self, coef=1, syms: Iterable[Sym] = ()):
        # an int first: isinstance against Fraction (an ABC's subclass) costs
        # more than the rest of making a Size
        if type(coef) is int:
            self.coef = _fraction(coef)
        else:
            self.coef = coef if type(coef) is Fraction or isinstance(coef, Fraction) else _fraction(coef)
        self.syms = tuple(syms)
        self._epoch = -1
        if not self.syms and type(coef) is int:
            # a static extent is its own canonical form, keyed by its int
            # (as canonical() would key it, without reading the Fraction's
            # numerator and denominator: Python properties, and plans make
            # static sizes for local blocks)
            self._canonical = None
            self._key = (coef, ())
            self._epoch = _EPOCH[0]

    # -- construction -------------------------------------------------------
    @staticmethod
    def of(value) -> "Size":
        if isinstance(value, Size):
            return value
        if isinstance(value, Sym):
            return Size(1, (value,))
        if isinstance(value, int):
            return Size(value)
        raise TypeError(f"cannot make an extent of {value!r}")

    def canonical(self) -> "Size":
        if self._epoch == _EPOCH[0]:
            return self if self._canonical is None else self._canonical
        canonical = self._compute_canonical()
        # None when a Size is its own canonical form: pointing at itself would
        # make every static Size a cycle for the garbage collector to find
        self._canonical = None if canonical is self else canonical
        coef = canonical.coef
        # ints hash much faster than Fractions, and these keys are hashed a lot
        self._key = (coef.numerator if coef.denominator == 1 else coef, tuple([id(s) for s in canonical.syms]))
        self._epoch = _EPOCH[0]
        return canonical

    def _compute_canonical(self) -> "Size":
        if not self.syms:
            return self
        coef = self.coef
        syms = []
        for s in self.syms:
            root = s.find()
            if root._static is not None:
                coef *= root._static
            else:
                syms.append(root)
        syms.sort(key=_sym_order)
        return Size(coef, syms)

    def key(self) -> tuple:
        self.canonical()
        return self._key

    # -- queries ------------------------------------------------------------
    @property
    def is_static(self) -> bool:
        return not self.canonical().syms

    @property
    def value(self) -> Optional[int]:
        c = self.canonical()
        if c.syms or c.coef.denominator != 1:
            return None
        return int(c.coef)

    def __eq__(self, other) -> bool:
        if isinstance(other, int):
            return self.key() == (other, ())  # Size(other).key(), without making it
        if not isinstance(other, Size):
            return NotImplemented
        return self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __mul__(self, other) -> "Size":
        other = Size.of(other)
        a, b = self.coef, other.coef
        if a.denominator == 1 and b.denominator == 1:
            # whole coefficients (nearly all): an int product, its Fraction made
            # once (Fraction arithmetic is pure Python, several times slower)
            return Size(a.numerator * b.numerator, self.syms + other.syms).canonical()
        return Size(a * b, self.syms + other.syms).canonical()

    __rmul__ = __mul__

    def divided_by(self, other) -> Optional["Size"]:
        """self / other when the symbols divide exactly; None otherwise.
        Integer coefficients may become fractions: a symbol is assumed to be
        divisible, and that is checked once sizes are concrete."""
        a, b = self.canonical(), Size.of(other).canonical()
        remaining = list(a.syms)
        for s in b.syms:
            for i, r in enumerate(remaining):
                if r is s:
                    del remaining[i]
                    break
            else:
                return None
        p, q = a.coef, b.coef
        if p.denominator == 1 and q.denominator == 1 and p.numerator % q.numerator == 0:
            return Size(p.numerator // q.numerator, remaining)  # (a whole quotient, as in __mul__)
        return Size(p / q, remaining)

    def divisible_by(self, d: int) -> Optional[bool]:
        """True/False when decidable, None when it depends on symbols."""
        c = self.canonical()
        if (c.coef / d).denominator == 1:
            return True
        if not c.syms:
            return False
        return None

    def evaluate(self, bindings: dict) -> int:
        c = self.canonical()
        value = c.coef
        for s in c.syms:
            if s not in bindings:
                raise KeyError(f"extent {s.name} is not bound")
            value *= bindings[s]
        if value.denominator != 1:
            raise ValueError(f"extent {self} evaluates to the fraction {value}")
        return int(value)

    def estimate(self, guess: int) -> float:
        """A number for cost heuristics when symbols are unbound."""
        c = self.canonical()
        return float(c.coef) * guess ** len(c.syms)

    # -- printing -------------------------------------------------------------
    def __str__(self) -> str:
        c = self.canonical()
        if not c.syms:
            if c.coef.denominator == 1:
                return str(int(c.coef))
            return f"( {c.coef.numerator} / {c.coef.denominator} )"
        terms = [s.name for s in c.syms]
        if c.coef.numerator != 1:
            terms.insert(0, str(c.coef.numerator))
        text = terms[0]
        for t in terms[1:]:
            text = f"( {text} * {t} )"
        if c.coef.denominator != 1:
            # A symbolic extent divided by a split factor, as nvFuser prints it.
            text = f"( ceilDiv({text}, {c.coef.denominator}) )"
        return text

    def __repr__(self) -> str:
        return f"Size({self})"


def whole_quotient(a: Size, b: Size):
    """a / b when it is a whole extent, else None. Symbols are assumed to
    divide (checked once sizes are concrete)."""
    q = a.divided_by(b)
    if q is None:
        return None
    c = q.canonical()
    if not c.syms and c.coef.denominator != 1:
        return None
    return q


def unify(a: Size, b: Size, what: str = "extents") -> None:
    """Record that two extents are equal (operands of one pointwise op)."""
    ca, cb = a.canonical(), b.canonical()
    if ca.key() == cb.key():
        return
    if len(ca.syms) == 1 and ca.coef == 1 and len(cb.syms) == 1 and cb.coef == 1:
        unify_syms(ca.syms[0], cb.syms[0])
        return
    if len(ca.syms) == 1 and ca.coef == 1 and not cb.syms:
        _bind_static(ca.syms[0], cb, what)
        return
    if len(cb.syms) == 1 and cb.coef == 1 and not ca.syms:
        _bind_static(cb.syms[0], ca, what)
        return
    if not ca.syms and not cb.syms:
        raise ValueError(f"{what} {ca} and {cb} must be equal")
    # Products of symbols: nothing to unify now; run-time shape checks catch
    # a mismatch.


def bind_static(sym: Sym, value: int) -> None:
    """Record that a symbol is this static extent."""
    _bind_static(sym, Size(value), "extents")


def _bind_static(sym: Sym, value: Size, what: str) -> None:
    root = sym.find()
    v = value.value
    if v is None:
        return
    if root._static is not None and root._static != v:
        raise ValueError(f"{what} {root.name} = {root._static} and {v} must be equal")
    root._static = v
    _EPOCH[0] += 1


@runtime_checkable
class SizeQueries(Protocol):
    """The size questions ops, layouts and the passes ask, answered by the
    SizeEvaluator (ir/size_evaluator.py: every extent bound from input
    shapes), the executor's per-rank EvalContext (runtime/context.py: the
    same, for the device an op runs on) and Fusion's static resolver
    (ir/nodes.py: static extents only, for definition time). A structural
    interface: none of them inherits it, so one that lacks a method fails
    the isinstance/issubclass check (test_regressions) instead of getting
    this class's empty stub."""

    def evaluate_size(self, size: Size) -> int:
        """The value of an extent."""

    def global_extent(self, tv, axis: int) -> int:
        """The global extent of non-reduction axis `axis` of `tv`."""

    def scalar(self, value):
        """The value of a Scalar (other values pass through)."""
