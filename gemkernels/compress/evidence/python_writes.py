"""The paths Python code may write: ``open(p, "w")``, ``Path.write_text``, ``shutil``/``os`` file operations,
saves."""


from __future__ import annotations

import re

PY_CALL = re.compile(r"(?<![\w])(open|write_text|write_bytes|touch|unlink|rmdir|remove|removedirs|rename|replace|"
                     r"renames|copy|copy2|copyfile|copytree|move|rmtree|save|savez|savez_compressed|savetxt|"
                     r"savefig|to_csv|to_json|to_excel|to_parquet|to_pickle)\(")
PY_ASSIGN = re.compile(r"(?:^|;)[ \t]*([A-Za-z_]\w*)[ \t]*=(?!=)[ \t]*([^;\n]+?)[ \t]*(?=;|$)", re.M)
PY_STRING = re.compile(r"([rRbBuUfF]{0,2})(['\"])((?:\\.|(?!\2).)*)\2", re.S)
WRITE_MODE = re.compile(r"[wax+]")


def python_writes(code: str) -> list[str]:
    """Paths Python code may change: ``open(p, "w"/"a"/"x"/"+")``, ``Path.write_text``, ``shutil``/``os`` file
    operations, ``savefig``/``to_csv``/``np.save``. Literal and simply assigned paths are resolved; others
    are kept as ``<expression>``."""
    assigns = {m.group(1): m.group(2) for m in PY_ASSIGN.finditer(code)}
    found = []
    for match in PY_CALL.finditer(code):
        name = match.group(1)
        head = receiver(code, match.start() - 1) if code[match.start() - 1:match.start()] == "." else ""
        args = call_arguments(code, match.end())
        for expr in written_arguments(name, head, args):
            found.append(resolve(expr, assigns) or f"<{' '.join(expr.split())[:80]}>")
    return found


MODULE_WRITES = {  # (module, function) -> the positional arguments that name written paths
    **{("os", f): slice(0, 1) for f in ("remove", "unlink", "rmdir", "removedirs")},
    **{("os", f): slice(0, 2) for f in ("rename", "replace", "renames")},
    **{("shutil", f): slice(1, 2) for f in ("copy", "copy2", "copyfile", "copytree")},
    ("shutil", "move"): slice(0, 2), ("shutil", "rmtree"): slice(0, 1), ("torch", "save"): slice(1, 2),
    **{(m, f): slice(0, 1) for m in ("np", "numpy") for f in ("save", "savez", "savez_compressed", "savetxt")},
}
MODULES = {"", "os", "shutil", "np", "numpy", "torch", "io", "codecs", "builtins"}
PATH_METHODS = {"write_text", "write_bytes", "touch", "unlink", "rmdir"}  # pathlib: the receiver is the path
SAVE_METHODS = {"savefig", "to_csv", "to_json", "to_excel", "to_parquet", "to_pickle"}  # first argument


def written_arguments(name: str, head: str, args: list[str]) -> list[str]:
    """The expressions a call ``head.name(args)`` writes to (``head`` is '' for a plain function call)."""
    positional = [a for a in args if not re.match(r"[A-Za-z_]\w*\s*=(?!=)", a)]
    keyword = dict(re.match(r"([A-Za-z_]\w*)\s*=(?!=)\s*(.*)", a, re.S).groups() for a in args if a not in positional)
    if name == "open" and head in ("", "io", "codecs", "builtins"):
        return positional[:1] if writes(positional[1] if len(positional) > 1 else keyword.get("mode", "")) else []
    if name == "open" and head not in MODULES:
        return [head] if writes(positional[0] if positional else keyword.get("mode", "")) else []
    if (head, name) in MODULE_WRITES:
        return positional[MODULE_WRITES[head, name]]
    if name in PATH_METHODS and head not in MODULES:
        return [head]
    return positional[:1] if name in SAVE_METHODS and head else []


def writes(mode: str) -> bool:
    """Whether a Python ``open`` mode literal (``'w'``, ``"a+"``, ``'xb'``) opens for writing."""
    literal = PY_STRING.fullmatch(mode.strip())
    return bool(literal and re.fullmatch(r"[rwaxbtU+]+", literal.group(3)) and WRITE_MODE.search(literal.group(3)))


def call_arguments(code: str, start: int, separator: str = ",") -> list[str]:
    """Top-level ``separator``-separated arguments from ``start`` to the unmatched ``)`` (or the end)."""
    args, depth, quote, begin, i = [], 0, "", start, start
    while i < len(code):
        char = code[i]
        if quote:
            if char == "\\":
                i += 1
            elif code.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif char in "'\"":
            quote = code[i:i + 3] if code[i:i + 3] in ("'''", '"""') else char
            i += len(quote) - 1
        elif char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char == ")" or (char == separator and depth == 0):
            args.append(code[begin:i].strip())
            begin = i + 1
            if char == ")":
                return [a for a in args if a]
        i += 1
    args.append(code[begin:].strip())
    return [a for a in args if a]


def receiver(code: str, dot: int) -> str:
    """The expression before ``code[dot] == "."``: names, dots and bracketed groups (``Path("a").x``)."""
    j = dot
    while j > 0:
        char = code[j - 1]
        if char in ")]":
            depth, j = 0, j - 1
            while j >= 0:
                depth += code[j] in ")]"
                depth -= code[j] in "(["
                if depth == 0:
                    break
                j -= 1
        elif char.isalnum() or char in "_.":
            j -= 1
        else:
            break
    return code[max(j, 0):dot].strip()


def resolve(expr: str, assigns: dict[str, str], depth: int = 0) -> str | None:
    """The path a Python expression names: a literal, ``Path(...)``, ``os.path.join(...)``, ``a / b``, or a
    name assigned one of these; None when it is not that simple."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and receiver(expr + ".", len(expr)) == expr:
        expr = expr[1:-1].strip()
    string = PY_STRING.fullmatch(expr)
    if string:
        prefix, _, value = string.groups()
        return None if "f" in prefix.lower() and "{" in value else value
    wrapped = re.fullmatch(r"(?:pathlib\.)?(?:Path|PurePath|PosixPath)\((.*)\)|os\.path\.(?:join|abspath|realpath|"
                           r"normpath|expanduser)\((.*)\)", expr, re.S)
    parts = call_arguments(expr, expr.index("(") + 1) if wrapped else call_arguments(expr, 0, "/")
    if wrapped or len(parts) > 1:
        resolved = [resolve(p, assigns, depth + 1) for p in parts]
        return "/".join(resolved) if resolved and all(resolved) else None
    if re.fullmatch(r"[A-Za-z_]\w*", expr) and expr in assigns and depth < 4:
        return resolve(assigns[expr], assigns, depth + 1)
    return None
