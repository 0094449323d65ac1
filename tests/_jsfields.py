"""The fields the report pages' and the explorer's scripts read from documents, each checked against its declared
schema (:mod:`walklens.reports.schemas`): a tokenizer and a small flow of document types through the scripts.

The rule.  A *document variable* is a name (a function's parameter, a ``var``, or the global ``W.info``) holding a
document, or a record inside one.  It gets its type from

1. a reply: the parameter P of ``W.call(..., "/api/PATH", ...).then(function (P) ...)`` is PATH's reply
   (``REPLIES``); after ``Promise.all(N).then(function (P)``, N a ``var`` whose initializer calls ``W.call`` with
   PATH, P is a list of them;
2. a page's document: the second parameter of each function of results.js's ``draw`` map is the document of its
   kind (``DOCUMENTS``; a kind not declared is reported);
3. the model list: a view's ``init(info)`` (app.js calls it with the /api/info reply); ``W.info = X`` gives
   ``W.info`` X's type;
4. an alias: ``var N = CHAIN`` or ``N = CHAIN`` whose whole right-hand side is a chain (below);
5. a call: ``f(..., CHAIN, ...)`` of a function of the same script (or ``W.results.NAME(...)``,
   ``W.results.draw.KIND(...)``: results.js's) types the parameter at that place; ``return CHAIN`` in
   ``W.NAME = function`` types what ``W.NAME(...)`` returns;
6. a callback: in ``CHAIN.forEach|map|filter|some|every|find(F`` on a list, F's first parameter (F a function or
   the name of one) is an element.

A *chain* is a document variable followed by steps: ``.name`` on a record reads its field ``name`` -- reported
unless the record declares it (a name holding several types must find it in each); on a list ``.name`` is the
array's own (``length``, ``map``); on a map it is a value.  ``[...]`` on a list or a map is an element or a value,
on a record a key the script computes (not checked).  Lastly, the strings of the array passed as ``fields:`` to
``W.call`` are fields read from that reply.  Names the flow cannot type (an array of rows, a row taken from it) are
not checked: the test counts the reads it does check, so a view the flow no longer reaches fails it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from walklens.reports.schemas import ListOf, MapOf, Node, Record

_PUNCT = ("===", "!==", "==", "!=", "<=", ">=", "&&", "||", "++", "--", "+=", "-=", "=>")
_BEFORE_REGEX = set("(,=:[!&|?{};+-*%<>~^") | {"&&", "||", "==", "===", "!=", "!==", "return", "typeof"}
_ITERATE = ("forEach", "map", "filter", "some", "every", "find")
_CLOSE = {"(": ")", "[": "]", "{": "}"}


@dataclass
class Tok:
    kind: str  # id, str, num, punct, regex
    text: str
    line: int


def tokenize(src: str) -> list[Tok]:
    """JavaScript tokens: comments dropped, strings kept as their raw text, regular expressions as one token."""
    out: list[Tok] = []
    i, line, n = 0, 1, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            line += c == "\n"
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.index("*/", i) + 2
            line, i = line + src.count("\n", i, j), j
        elif c in "'\"`":
            j = i + 1
            while src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(Tok("str", src[i + 1 : j], line))
            line, i = line + src.count("\n", i, j), j + 1
        elif c.isalpha() or c in "_$":
            m = re.compile(r"[\w$]+").match(src, i)
            assert m
            out.append(Tok("id", m.group(), line))
            i = m.end()
        elif c.isdigit():
            m = re.compile(r"[\w.]+").match(src, i)
            assert m
            out.append(Tok("num", m.group(), line))
            i = m.end()
        elif c == "/" and (not out or (out[-1].kind in ("punct", "id") and out[-1].text in _BEFORE_REGEX)):
            j, cls = i + 1, False
            while src[j] != "/" or cls:
                cls = (cls or src[j] == "[") and src[j] != "]"
                j += 2 if src[j] == "\\" else 1
            m = re.compile(r"[a-z]*").match(src, j + 1)
            assert m
            out.append(Tok("regex", src[i : m.end()], line))
            i = m.end()
        else:
            p = next((p for p in _PUNCT if src.startswith(p, i)), c)
            out.append(Tok("punct", p, line))
            i += len(p)
    return out


@dataclass(eq=False)
class Fn:
    """A function of a script: its parameters, body (token indices of its braces), enclosing function, names."""

    file: str
    start: int
    params: list[str]
    body: tuple[int, int]
    parent: Fn | None
    decls: dict[str, Fn | None] = field(default_factory=dict)  # name -> the function it names (None: a variable)


@dataclass
class Script:
    name: str
    toks: list[Tok]
    match: dict[int, int]  # an opening bracket's index -> its closing one
    fns: list[Fn]
    top: Fn
    scope_of: list[Fn] = field(default_factory=list)  # each token's innermost function
    inits: list[tuple[tuple[Any, str], int, int]] = field(default_factory=list)  # (binding, expr start, expr end)


def _match(toks: list[Tok]) -> dict[int, int]:
    out, stack = {}, []
    for i, t in enumerate(toks):
        if t.kind == "punct" and t.text in _CLOSE:
            stack.append(i)
        elif t.kind == "punct" and t.text in (")", "]", "}"):
            out[stack.pop()] = i
    return out


def _end(s: Script, i: int, stops: tuple[str, ...]) -> int:
    """The end of an expression starting at ``i``: the first of ``stops`` (or closing bracket) outside brackets."""
    while i < len(s.toks) and not (s.toks[i].kind == "punct" and s.toks[i].text in (*stops, ")", "]", "}")):
        i = s.match[i] + 1 if s.toks[i].kind == "punct" and s.toks[i].text in _CLOSE else i + 1
    return i


def parse(name: str, src: str) -> Script:
    """A script's functions and the names each declares (parameters, ``var``s, named functions)."""
    toks = tokenize(src)
    match = _match(toks)
    top = Fn(name, -1, [], (-1, len(toks)), None)
    s = Script(name, toks, match, [], top)
    stack = [top]
    for i, t in enumerate(toks):
        while stack[-1] is not top and i > stack[-1].body[1]:
            stack.pop()
        s.scope_of.append(stack[-1])
        if t.text == "function" and t.kind == "id":
            named = toks[i + 1].kind == "id"
            o = i + 2 if named else i + 1
            params = [x.text for x in toks[o + 1 : match[o]] if x.kind == "id"]
            fn = Fn(name, i, params, (match[o] + 1, match[match[o] + 1]), stack[-1])
            fn.decls.update(dict.fromkeys(params))
            if named:
                stack[-1].decls[toks[i + 1].text] = fn
            s.fns.append(fn)
            stack.append(fn)
            s.scope_of[-1] = fn
        elif t.text == "var" and t.kind == "id":
            j = i + 1
            while toks[j].kind == "id":
                stack[-1].decls.setdefault(toks[j].text, None)
                end = _end(s, j + 2, (",", ";")) if toks[j + 1].text == "=" else j + 1
                if toks[j + 1].text == "=":
                    s.inits.append(((stack[-1], toks[j].text), j + 2, end))
                if toks[end].text != ",":
                    break
                j = end + 1
    return s


class Flow:
    """The document types of every script's names, found by the rules of the module docstring, and the reads."""

    def __init__(self, scripts: dict[str, str], documents: dict[str, Node], replies: dict[str, Record]) -> None:
        self.s = {k: parse(k, v) for k, v in scripts.items()}
        self.documents, self.replies = documents, replies
        self.types: dict[tuple[Any, str], list[Node]] = {}
        self.returns: dict[str, list[Node]] = {}  # "W.NAME" -> what it returns
        self.shared: dict[str, Fn] = {}  # "W.results.NAME", "W.results.draw.KIND" -> results.js's function
        self.errors: list[str] = []
        self.lists: dict[str, ListOf] = {}  # a path -> the list of its replies (one object: the flow stops)
        self.checked: set[tuple[str, int, str]] = set()  # (script, line, field) of every read checked
        self._report = False
        self.changed = True
        while self.changed:
            self.changed = False
            self._pass()
        self._report = True
        self._pass()
        self.errors = sorted(set(self.errors))

    # ---- names and their types ----------------------------------------------------------------------------------

    def scope(self, s: Script, i: int) -> Fn:
        return s.scope_of[i]

    def fn_at(self, s: Script, i: int) -> Fn:
        """The function whose ``function`` keyword is token ``i``."""
        return next(f for f in s.fns if f.start == i)

    def binding(self, s: Script, i: int) -> tuple[Any, str] | None:
        name, f = s.toks[i].text, self.scope(s, i)
        while f is not None:
            if name in f.decls:
                return (f, name)
            f = f.parent
        return None

    def fn_named(self, s: Script, i: int) -> Fn | None:
        b = self.binding(s, i)
        return b[0].decls.get(b[1]) if b else None

    def bind(self, key: tuple[Any, str], nodes: list[Node]) -> None:
        have = self.types.setdefault(key, [])
        for n in nodes:
            if n is not None and all(n is not h for h in have):
                have.append(n)
                self.changed = True

    def bind_param(self, fn: Fn | None, k: int, nodes: list[Node]) -> None:
        if fn is not None and k < len(fn.params):
            self.bind((fn, fn.params[k]), nodes)

    # ---- chains ---------------------------------------------------------------------------------------------------

    def root(self, s: Script, i: int) -> tuple[list[Node], int]:
        """The types of the document variable at token ``i`` and where its steps start (none: [])."""
        t = s.toks
        if t[i].kind != "id" or (i and t[i - 1].text == ".") or (t[i + 1].text == ":" and t[i - 1].text in ("{", ",")):
            return [], i
        if t[i].text == "W" and t[i + 1].text == "." and t[i + 2].kind == "id":
            name = "W." + t[i + 2].text
            if t[i + 3].text == "(" and name in self.returns:
                return list(self.returns[name]), s.match[i + 3] + 1
            return list(self.types.get(("W", name), [])), i + 3
        b = self.binding(s, i)
        return (list(self.types.get(b, [])), i + 1) if b else ([], i)

    def chain(self, s: Script, i: int) -> tuple[list[Node], int]:
        """The types a chain starting at ``i`` ends on and where it ends; binds callbacks, records reads."""
        nodes, j = self.root(s, i)
        t = s.toks
        while nodes and j < len(t):
            if t[j].text == "." and t[j + 1].kind == "id":
                nodes, j = self._dot(s, nodes, j + 1), j + 2
            elif t[j].text == "[":
                nodes, j = [n.of for n in nodes if isinstance(n, (ListOf, MapOf))], s.match[j] + 1
            else:
                break
            nodes = [n for n in nodes if n is not None]
            if nodes and j < len(t) and t[j].text == "(" and t[j - 1].text in ("filter", "find"):
                j = s.match[j] + 1  # the list (or element) the callback was bound on, above
        return nodes, j

    def _dot(self, s: Script, nodes: list[Node], j: int) -> list[Node]:
        name, out, lacking = s.toks[j].text, [], []
        for n in nodes:
            if isinstance(n, Record):
                if name in n.fields:
                    out.append(n.fields[name])
                elif not n.open:
                    lacking.append(n.name)
                if self._report:
                    self.checked.add((s.name, s.toks[j].line, name))
            elif isinstance(n, MapOf):
                out.append(n.of)
            elif isinstance(n, ListOf) and name in _ITERATE and s.toks[j + 1].text == "(":
                self._callback(s, j + 2, [n.of])
                out.append(n if name == "filter" else n.of if name == "find" else None)
        if lacking and self._report:
            self.errors.append(f"{s.name}:{s.toks[j].line}: reads {name!r}, not a field of {', '.join(lacking)}")
        return out

    def _callback(self, s: Script, i: int, nodes: list[Node]) -> None:
        if s.toks[i].text == "function":
            self.bind_param(self.fn_at(s, i), 0, nodes)
        elif s.toks[i].kind == "id" and s.toks[i + 1].text in (")", ","):
            self.bind_param(self.fn_named(s, i), 0, nodes)

    def _copy(self, s: Script, a: int, b: int) -> list[Node]:
        """Rule 4 for a copy, ``Object.assign({}, CHAIN, {name: ...})``: the chain's types; each name the copy
        sets must be a field of them (a view never adds a field of its own to a document)."""
        toks = s.toks
        head = ["Object", ".", "assign", "(", "{", "}", ","]
        if [x.text for x in toks[a : a + 7]] != head or s.match[a + 3] != b - 1:
            return []
        end = _end(s, a + 7, (",",))
        nodes = self.expr(s, a + 7, end)
        while toks[end].text == "," and toks[end + 1].text == "{":
            lit, end = end + 1, s.match[end + 1] + 1
            keys = [
                k for k in range(lit + 1, s.match[lit]) if toks[k + 1].text == ":" and toks[k - 1].text in ("{", ",")
            ]
            for k in keys:
                for n in nodes:
                    if isinstance(n, Record) and toks[k].text not in n.fields and self._report:
                        self.errors.append(f"{s.name}:{toks[k].line}: sets {toks[k].text!r}, not a field of {n.name}")
        return nodes

    def expr(self, s: Script, a: int, b: int) -> list[Node]:
        """The types of the expression of tokens [a, b) when it is exactly a chain, else []."""
        nodes, j = self.chain(s, a)
        return nodes if j == b else []

    # ---- the rules ------------------------------------------------------------------------------------------------

    def _pass(self) -> None:
        for s in self.s.values():
            self._shared(s)
        for s in self.s.values():
            for key, a, b in s.inits:
                self.bind(key, self.expr(s, a, b) or self._copy(s, a, b))
            for i, t in enumerate(s.toks):
                self._at(s, i, t)

    def _at(self, s: Script, i: int, t: Tok) -> None:
        toks = s.toks
        if t.kind != "id" or (i and toks[i - 1].text in (".", "function")):
            return
        ahead = [x.text for x in toks[i + 1 : i + 8]]
        if t.text == "W" and ahead[:3] == [".", "call", "("]:
            self._reply(s, i + 3)
        elif t.text == "Promise" and ahead[:3] == [".", "all", "("] and ahead[4:5] == [")"]:
            self._all(s, i + 4)
        elif t.text == "W" and ahead[:4] == [".", "results", ".", "draw"] and ahead[6:7] == ["("]:
            self._call(s, i + 7, self.shared.get(f"W.results.draw.{ahead[5]}"))
        elif t.text == "W" and ahead[:3] == [".", "results", "."] and ahead[4:5] == ["("]:
            self._call(s, i + 5, self.shared.get(f"W.results.{ahead[3]}"))
        elif t.text == "W" and ahead[:1] == ["."]:
            self._assign_w(s, i)
        elif ahead[:1] == ["="]:
            b = self.binding(s, i)
            if b:
                self.bind(b, self.expr(s, i + 2, _end(s, i + 2, (",", ";"))))
        elif ahead[:1] == ["("]:
            self._call(s, i + 1, self.fn_named(s, i))
        self.chain(s, i)

    def _shared(self, s: Script) -> None:
        """results.js: its ``draw`` map (rule 2) and the functions it exports (``window.walklensResults``)."""
        toks = s.toks
        for i, t in enumerate(toks):
            if t.text == "draw" and toks[i - 1].text == "var" and toks[i + 2].text == "{":
                for k in range(i + 3, s.match[i + 2], 4):
                    kind, fn = toks[k].text, self.fn_named(s, k + 2)
                    self.shared[f"W.results.draw.{kind}"] = fn  # type: ignore[assignment]
                    if kind not in self.documents:
                        self.errors.append(f"{s.name}:{toks[k].line}: draws {kind!r}, not a declared document kind")
                    self.bind_param(fn, 1, [self.documents.get(kind)])
            if t.text == "walklensResults" and toks[i + 1].text == "=" and toks[i + 2].text == "{":
                for k in range(i + 3, s.match[i + 2], 4):
                    if toks[k + 2].text != "draw":
                        self.shared[f"W.results.{toks[k].text}"] = self.fn_named(s, k + 2)  # type: ignore[assignment]

    def _reply(self, s: Script, o: int) -> None:
        """Rule 1: ``W.call(..., "/api/PATH", ...).then(function (P)``; and the ``fields:`` it asks for."""
        toks, c = s.toks, s.match[o]
        path = next((x.text for x in toks[o + 1 : c] if x.kind == "str" and x.text.startswith("/api/")), None)
        if path is None or path not in self.replies:
            if self._report:
                self.errors.append(f"{s.name}:{toks[o].line}: calls {path!r}, not a declared reply")
            return
        rep = self.replies[path]
        if [x.text for x in toks[c + 1 : c + 5]] == [".", "then", "(", "function"]:
            self.bind_param(self.fn_at(s, c + 4), 0, [rep])
        for k in range(o + 1, c):
            if toks[k].text == "fields" and toks[k + 1].text == ":" and self._report:
                self._fields(s, k + 2, rep)

    def _fields(self, s: Script, i: int, rep: Record) -> None:
        b = self.binding(s, i)
        init = next((a for key, a, _ in s.inits if key == b), None)
        if init is None or s.toks[init].text != "[":
            self.errors.append(f"{s.name}:{s.toks[i].line}: fields: not a var holding an array of names")
            return
        for x in s.toks[init : s.match[init]]:
            if x.kind == "str":
                self.checked.add((s.name, x.line, x.text))
                if x.text not in rep.fields:
                    self.errors.append(f"{s.name}:{x.line}: asks for {x.text!r}, not a field of {rep.name}")

    def _all(self, s: Script, i: int) -> None:
        """Rule 1: ``Promise.all(N).then(function (P)`` with N's initializer calling ``W.call`` with a path."""
        init = next(((a, b) for key, a, b in s.inits if key == self.binding(s, i)), None)
        toks = s.toks
        if init is None or [x.text for x in toks[i + 2 : i + 6]] != [".", "then", "(", "function"]:
            return
        path = next((x.text for x in toks[init[0] : init[1]] if x.text in self.replies), None)
        if path is not None:
            listed = self.lists.setdefault(path, ListOf(self.replies[path]))
            self.bind_param(self.fn_at(s, i + 5), 0, [listed])

    def _assign_w(self, s: Script, i: int) -> None:
        """Rules 3 and 5: ``W.views.X = {init: g}``, ``W.info = X`` and ``W.NAME = function ... return CHAIN``."""
        toks = s.toks
        if toks[i + 2].text == "views" and toks[i + 5].text == "=" and toks[i + 6].text == "{":
            for k in range(i + 7, s.match[i + 6], 4):
                if toks[k].text == "init":
                    self.bind_param(self.fn_named(s, k + 2), 0, [self.replies["/api/info"]])
        elif toks[i + 3].text == "=" and toks[i + 4].text == "function":
            fn, name = self.fn_at(s, i + 4), f"W.{toks[i + 2].text}"
            have = self.returns.setdefault(name, [])
            for k in range(fn.body[0], fn.body[1]):
                if toks[k].text == "return" and self.scope(s, k) is fn:
                    for n in self.expr(s, k + 1, _end(s, k + 1, (";",))):
                        if all(n is not h for h in have):
                            have.append(n)
                            self.changed = True
        elif toks[i + 3].text == "=":
            self.bind(("W", f"W.{toks[i + 2].text}"), self.expr(s, i + 4, _end(s, i + 4, (",", ";"))))

    def _call(self, s: Script, o: int, fn: Fn | None) -> None:
        """Rule 5: in the call whose ``(`` is token ``o``, each argument that is a chain types ``fn``'s parameter at
        its place."""
        if fn is None:
            return
        k, a = 0, o + 1
        while a < s.match[o]:
            b = _end(s, a, (",",))
            self.bind_param(fn, k, self.expr(s, a, b))
            k, a = k + 1, b + 1


def check(scripts: dict[str, str], documents: dict[str, Node], replies: dict[str, Record]) -> Flow:
    """The flow of document types through ``scripts`` (name -> source): ``errors``, and every read ``checked``."""
    return Flow(scripts, documents, replies)
