"""A kernel file's entry points as programs of their own: the source one kernel needs (the file with
every other kernel cut out, line numbers kept) and the -D options that can change it.

PoCL's build time grows with every kernel a program holds (a file of two dozen kernels takes
several times as long as one of them), so runtime.kernels builds each kernel a launch asks for as
its own program, with only the -D options its text, or a definition it reaches, names (a define
another kernel of the file reads builds nothing anew). Which definitions a kernel reaches is read
from the file without a preprocessor: a macro, function, type or constant named in the kernel, in
turn in what those name, and the conditions (#if, #ifdef, #elif) every such definition sits in.
Anything it cannot place (a macro invoked at file scope, say) counts as reached by every kernel, so
an option is left out only where no reading of the file could make it matter; tests/test_runtime.py
checks the split against the C preprocessor for every kernel netcl ships."""
import hashlib
import re
from dataclasses import dataclass, field

_NOT_CODE = re.compile(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_KERNEL_NAME = re.compile(r"\bvoid\s+(\w+)\s*\(")
_DIRECTIVE = re.compile(r"\s*#\s*(\w+)(.*)", re.S)
_DEFINE = re.compile(r"\s*(\w+)(\([^)]*\))?(.*)", re.S)
# words that name no definition of the file (a declaration's types and qualifiers)
_NOT_NAMES = re.compile(r"(?:u?(?:char|short|int|long)|float|double|half|bool|void|size_t|uint|ulong|uchar|ushort)"
                        r"\d*|inline|static|const|constant|__constant|global|__global|local|__local|private|"
                        r"__private|kernel|__kernel|typedef|struct|union|enum|unsigned|signed|volatile|restrict|"
                        r"__attribute__|aligned|extern|return|if|else|for|while|do")


@dataclass
class _Unit:
    names: tuple  # what it defines
    ids: frozenset  # the identifiers its text names
    cond: frozenset  # the identifiers of the conditions it sits in
    span: tuple = (0, 0)  # its text's start and end in the source
    always: bool = False  # not placed: every kernel reaches it


@dataclass
class Split:
    """A kernel file read once: its kernels' spans and the definitions around them."""
    source: str
    digest: bytes = b""  # SHA-256 of the source
    kernels: dict = field(default_factory=dict)  # name -> (start, end, _Unit)
    units: list = field(default_factory=list)
    _reach: dict = field(default_factory=dict)  # kernel name -> the identifiers it reaches

    def names(self):
        """The file's kernel names, in the file's order."""
        return tuple(self.kernels)

    def program_source(self, name):
        """The source of kernel `name`'s program: the file with every kernel but it, and every
        definition it does not reach, replaced by as many newlines (lines keep their numbers)."""
        reach = self.reached(name)
        cut = [(start, end) for other, (start, end, _) in self.kernels.items() if other != name]
        cut += [u.span for u in self.units if not u.always and not reach & set(u.names)]
        out, at = [], 0
        for start, end in sorted(cut):
            out += [self.source[at:start], "\n" * self.source.count("\n", start, end)]
            at = end
        return "".join(out) + self.source[at:]

    def reached(self, name):
        """The identifiers kernel `name` reaches through the file's definitions (see the module's doc)."""
        if name not in self._reach:
            by_name = {}
            for u in self.units:
                for n in u.names:
                    by_name.setdefault(n, []).append(u)
            unit = self.kernels[name][2]
            need = set(unit.ids | unit.cond)
            for u in self.units:
                if u.always:
                    need |= u.ids | u.cond
            work = list(need)
            while work:
                x = work.pop()
                # a name pasted together (VCAT(hsum, WV) -> hsum16, VCAT(EVENS_, n) -> EVENS_8): every
                # definition it begins that goes on with digits, or after its underscore
                found = by_name.get(x, []) + [u for n, us in by_name.items() if n != x and n.startswith(x) and (
                    n[len(x):].isdigit() or x.endswith("_")) for u in us]
                for u in found:
                    for y in u.ids | u.cond | set(u.names):
                        if y not in need:
                            need.add(y)
                            work.append(y)
            self._reach[name] = frozenset(need)
        return self._reach[name]

    def options_for(self, name, options):
        """The build options that can change kernel `name`: every option but -D ones whose macro it
        does not reach."""
        reach = self.reached(name)
        return tuple(o for o in options if not o.startswith("-D") or _macro(o) in reach)


def _macro(option):
    return option[2:].split("=", 1)[0].strip()


def _ids(text):
    return frozenset(_IDENT.findall(text))


def _blank(source):
    """`source` with comments and strings blanked by spaces (newlines kept): the same offsets."""
    return _NOT_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


_splits = {}  # SHA-256 of a source -> its Split


def split(source):
    """The Split of kernel source `source` (its headers inlined), cached by its text."""
    key = hashlib.sha256(source.encode()).digest()
    s = _splits.get(key)
    if s is None:
        s = _splits[key] = _read(source)
        s.digest = key
    return s


def _read(source):
    code = _blank(source)
    out = Split(source)
    cond = []  # a list of identifier sets per open conditional
    macros = set()  # function-like macros the file defines
    lines = code.split("\n")
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    chunk_start, depth, parens = 0, 0, 0  # the current chunk began at chunk_start

    def conditions():
        return frozenset().union(*cond) if cond else frozenset()

    def close_chunk(end):
        nonlocal chunk_start
        text = code[chunk_start:end]
        if text.strip():
            _add_chunk(out, text, chunk_start, end, conditions(), macros)
        chunk_start = end

    i = 0
    while i < len(lines):
        line = lines[i]
        if depth == 0 and parens == 0 and line.lstrip().startswith("#"):
            close_chunk(offsets[i])
            text, first = line, offsets[i]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i]
            _directive(out, text, cond, conditions, macros, (first, offsets[i] + len(lines[i])))
            i += 1
            chunk_start = offsets[i] if i < len(lines) else len(code)
            continue
        if not line.lstrip().startswith("#"):  # (a directive inside a definition is part of its text)
            for m in re.finditer(r"__kernel\b|[{}();]", line):
                tok, pos = m.group(0), offsets[i] + m.start()
                if tok == "__kernel" and depth == 0 and parens == 0:
                    close_chunk(pos)
                elif tok == "{":
                    depth += 1
                elif tok == "}":
                    depth -= 1
                    if depth == 0 and parens == 0:
                        close_chunk(pos + 1)
                elif tok == "(":
                    parens += 1
                elif tok == ")":
                    parens -= 1
                elif tok == ";" and depth == 0 and parens == 0:
                    close_chunk(pos + 1)
        i += 1
    close_chunk(len(code))
    return out


def _directive(out, text, cond, conditions, macros, span):
    m = _DIRECTIVE.match(text)
    if not m:
        return
    word, rest = m.group(1), m.group(2)
    if word in ("if", "ifdef", "ifndef"):
        cond.append(set(_ids(rest)))
    elif word == "elif":
        if cond:
            cond[-1] |= _ids(rest)
    elif word == "endif":
        if cond:
            cond.pop()
    elif word in ("define", "undef"):
        d = _DEFINE.match(rest)
        if d:
            name = d.group(1)
            if d.group(2) is not None and word == "define":
                macros.add(name)
            out.units.append(_Unit((name,), _ids(rest) - {name}, conditions(), span))
    # #else, #pragma, #include, #error: nothing to place


def _add_chunk(out, text, start, end, cond, macros):
    ids = _ids(text)
    if text.lstrip().startswith("__kernel"):
        m = _KERNEL_NAME.search(text)
        if m:
            out.kernels[m.group(1)] = (start, end, _Unit((m.group(1),), ids, cond, (start, end)))
            return
    top = _top_level(text)
    invoked = {n for n in re.findall(r"([A-Za-z_]\w*)\s*\(", top) if n in macros}
    out.units.append(_Unit(_declared(top), ids, cond, (start, end), always=bool(invoked) or not _declared(top)))


def _declared(top):
    """The names a declaration at file scope defines, from its text without what brackets hold: a
    typedef's last word, a function's word before the parentheses of its body, a struct's tag, a
    variable's word before its '=', '[' or ';'; failing those, every word that is no type or keyword."""
    words = [n for n in _IDENT.findall(top) if not _NOT_NAMES.fullmatch(n)]
    m = re.search(r"(\w+)\s*\(\)\s*\{", top)
    if top.lstrip().startswith("typedef"):
        found = words[-1:]
    elif m:
        found = [m.group(1)]
    elif re.match(r"\s*(struct|union|enum)\s+(\w+)\s*\{", top):
        found = [re.match(r"\s*\w+\s+(\w+)", top).group(1)]
    else:
        found = [n for n in _IDENT.findall(re.split(r"[=\[;]", top)[0]) if not _NOT_NAMES.fullmatch(n)][-1:]
    return tuple(found or words)


def _top_level(text):
    """`text` without what its braces, brackets and parentheses hold (their markers kept)."""
    out, depth = [], 0
    for c in text:
        if c in "{[(":
            if depth == 0:
                out.append(c)
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0:
                out.append(c)
        elif depth == 0:
            out.append(c)
    return "".join(out)
