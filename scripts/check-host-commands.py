#!/usr/bin/env python3
"""check-host-commands.py: every external command the host-side scripts run has an install step.

    scripts/check-host-commands.py [ROOT] [--list]

Reads the shell scripts that run on the host (scripts/*.sh, guest-lib/*.sh, guest-kmod/*.sh,
.ci/run, tests/host/*), finds the commands they run (the first word of each simple command, and the command
behind env, exec, timeout, setsid, xargs and the like), leaves out shell keywords, builtins and
the scripts' own functions, and checks each against scripts/host-commands.txt, which says where
the command comes from:

    COMMAND  PACKAGE  SOURCE

SOURCE is the script that installs PACKAGE (setup.sh, build-qemu.sh, ...: the package's name must
appear in that script outside its comments), `essential` (a package every Debian 12 system has:
Essential or of priority required, checked with dpkg-query), `built` (the repository builds it),
`rustup` (setup.sh installs Rust with rustup), `pip` (a venv of the repository's scripts),
`gpu-host` (only a GPU host has it; the scripts that need it check for it first) or `guest`
(the command runs inside a guest or a chroot, whose own packages provide it).

It fails, naming the script and line, on a command with no entry, on an entry whose install
script does not install its package, and on an entry whose package is wrong for the command
installed here (dpkg -S). --list prints every command found with its first use.
"""

import os
import re
import shutil
import subprocess
import sys

KEYWORDS = {
    "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "in", "case",
    "esac", "function", "select", "time", "!", "[[", "]]", "{", "}", "((", "))", "coproc",
}
BUILTINS = set(
    """alias bg bind break builtin caller cd command compgen complete compopt continue declare
    dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill
    let local logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt
    source suspend test times trap true type typeset ulimit umask unalias unset wait . : [
    """.split()
)
# Commands that run another command: how many words (after options) come before it.
WRAPPERS = {
    "env": 0, "exec": 0, "timeout": 1, "setsid": 0, "nice": 0, "nohup": 0, "sudo": 0,
    "xargs": 0, "stdbuf": 0, "ionice": 0, "taskset": 1, "chroot": 1, "flock": 1,
    "unshare": 0, "command": 0, "builtin": 0, "time": 0, "strace": 0, "nsenter": 0,
}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.+-]*$")
FUNC_DEF = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)\s*\{?")
CASE_PATTERN = re.compile(
    r"""^\s*\(?((?:"[^"]*"|'[^']*'|[^\s()"'|;])+(?:\s*\|\s*(?:"[^"]*"|'[^']*'|[^\s()"'|;])+)*)\)(?=\s|$)"""
)


PATTERN_ALT = r"""(?:"[^"]*"|'[^']*'|[^\s()"'|;])+(?:\s*\|\s*(?:"[^"]*"|'[^']*'|[^\s()"'|;])+)*"""


def strip_case_patterns(line):
    """Drops case patterns ("pat)" at a line's start, after ";;" and after "case WORD in")."""
    if re.search(r"\)(\s|$)", line):
        line = CASE_PATTERN.sub(" ", line)
        line = re.sub(r";;&?\s*\(?" + PATTERN_ALT + r"\)(?=\s|$)", ";; ", line)
        line = re.sub(r"(\bcase\s+\S+\s+in)\s+\(?" + PATTERN_ALT + r"\)(?=\s|$)", r"\1 ; ", line)
    return line


def host_scripts(root):
    out = []
    for d in ("scripts", "guest-lib", "guest-kmod", ".ci", "tests/host"):
        p = os.path.join(root, d)
        if not os.path.isdir(p):
            continue
        for n in sorted(os.listdir(p)):
            f = os.path.join(p, n)
            if not os.path.isfile(f):
                continue
            if n.endswith(".sh") or (d == ".ci" and n == "run"):
                out.append(f)
            elif d == "tests/host" and "." not in n:
                with open(f, encoding="utf-8", errors="replace") as fh:
                    if re.match(r"#!.*\b(ba)?sh\b", fh.readline()):
                        out.append(f)
    return out


def strip_heredocs(lines):
    """Blanks heredoc bodies (data, or commands fed to another shell or program)."""
    out, end = [], None
    for line in lines:
        if end is not None:
            out.append("")
            if line.strip() == end:
                end = None
            continue
        m = re.search(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1", line)
        if m and "<<<" not in line[: m.start() + 3]:
            end = m.group(2)
        out.append(line)
    return out


def segments(text):
    """Yields (line number, words) for each simple command of a script's text (comments, quoted
    strings and arithmetic dropped; command substitutions inside double quotes kept)."""
    lineno = 1
    words, word = [], ""
    seg_line = 1
    i, n = 0, len(text)
    quote = None  # None, '"'
    stack = []  # what a ")" closes: "sub" ($(...)), "paren" ((...))

    drop = [False]

    def end_word():
        nonlocal word
        if word:
            if drop[0]:
                drop[0] = False
            else:
                words.append(word)
            word = ""

    def end_seg():
        nonlocal words, seg_line
        end_word()
        drop[0] = False
        if words:
            yield_list.append((seg_line, words))
        words = []
        seg_line = lineno

    yield_list = []
    while i < n:
        c = text[i]
        if c == "\n":
            lineno += 1
        if quote == '"':
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quote = None
                word += "\x01"
                i += 1
                continue
            if text.startswith("$(", i) and not text.startswith("$((", i):
                # a command inside the string: its own segments, the string goes on after it
                stack.append(("sub-dq", words, word, seg_line))
                words, word, seg_line = [], "", lineno
                quote = None
                i += 2
                continue
            i += 1
            continue
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                lineno += 1
            i += 2
            word += "\x01"
            continue
        if c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            lineno += text.count("\n", i, j)
            word += "\x01"
            i = j + 1
            continue
        if c == '"':
            quote = '"'
            i += 1
            continue
        if c == "#" and not word:
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("$((", i) or (text.startswith("((", i) and not word):
            # arithmetic: skip to the matching "))"
            depth, j = 0, i
            while j < n:
                if text[j] == "(":
                    depth += 1
                elif text[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            lineno += text.count("\n", i, j)
            word += "\x01"
            i = j + 1
            continue
        if text.startswith("$(", i):
            end_word()
            stack.append(("sub", words, "", seg_line))
            words, word, seg_line = [], "", lineno
            i += 2
            continue
        if text.startswith("${", i):
            depth, j = 0, i
            while j < n:
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            lineno += text.count("\n", i, j)
            word += "\x01"
            i = j + 1
            continue
        if c == "`":
            j = text.find("`", i + 1)
            j = n if j < 0 else j
            inner = text[i + 1 : j]
            for ln, ws in segments(inner):
                yield_list.append((lineno + ln - 1, ws))
            lineno += inner.count("\n")
            word += "\x01"
            i = j + 1
            continue
        if c == ")":
            end_seg()
            if stack:
                kind, w, wd, sl = stack.pop()
                if kind in ("sub", "sub-dq"):
                    words, word, seg_line = w, wd + "\x01", sl
                    if kind == "sub-dq":
                        quote = '"'
            i += 1
            continue
        if c == "(" and word.endswith("="):
            # an array assignment: its words are data
            depth, j = 0, i
            while j < n:
                if text[j] == "(":
                    depth += 1
                elif text[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            lineno += text.count("\n", i, j)
            word += "\x01"
            i = j + 1
            continue
        if c == "(":
            end_seg()
            stack.append(("paren", [], "", lineno))
            i += 1
            continue
        if c in ";&|\n":
            end_seg()
            i += 1
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        if c in "<>":
            # a redirection: drop it and its target
            if not word.isdigit():
                end_word()
            j = i
            while j < n and text[j] in "<>&0123456789-":
                j += 1
            op = text[i:j]
            if word.isdigit():
                word = ""  # the descriptor the operator redirects ("2>")
            if re.search(r"&([0-9]+|-)$", op):
                i = j  # a descriptor duplicated or closed: no target word
                continue
            while j < n and text[j] in " \t":
                j += 1
            if text.startswith("(", j) or text.startswith("<(", j) or text.startswith(">(", j):
                drop[0] = False  # process substitution: its commands are segments
                i = j + (0 if text.startswith("(", j) else 1)
                continue
            drop[0] = True  # the target, a word of its own (quotes and all)
            i = j
            continue
        word += c
        i += 1
    end_seg()
    return yield_list


def runner_functions(lines):
    """The scripts' functions that run their arguments as a command ("$@" after SHIFTS shifts,
    like test.sh's `step NAME CMD...`): name -> how many arguments come before the command."""
    runners = {}
    name, body = None, []
    for line in lines + ["}"]:
        m = FUNC_DEF.match(line)
        if m and name is None:
            name, body = m.group(1), [line]
            if re.search(r"\}\s*(#.*)?$", line.split("()", 1)[1]):
                lines_done = body
            else:
                continue
        elif name is not None:
            body.append(line)
            if not re.match(r"^\}\s*(#.*)?$", line):
                continue
            lines_done = body
        else:
            continue
        text = "\n".join(lines_done)
        if re.search(r"""(^|[;&|(]|\b(if|then|else|elif|do|!|exec|time))\s*"\$@"(\s|$)""", text, re.M):
            shifts = sum(int(x or 1) for x in re.findall(r"\bshift(?:\s+([0-9]+))?\b", text))
            runners[name] = shifts
        name = None
    return runners


def commands_of(words, runners=None):
    """The commands a simple command runs (its first word, and a wrapped command's)."""
    out = []
    i = 0
    while i < len(words):
        w = words[i]
        if runners and w in runners:
            i += 1 + runners[w]
            continue
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=", w):
            i += 1
            continue
        if w in ("for", "case", "select", "[[", "[", "test", "local", "declare", "export", "readonly"):
            return out
        if w in KEYWORDS:
            i += 1
            continue
        if w in ("command", "type", "hash") and i + 1 < len(words) and words[i + 1].startswith("-v"):
            return out
        out.append(w)
        if w in WRAPPERS:
            skip = WRAPPERS[w]
            i += 1
            while i < len(words) and (words[i].startswith("-") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i])):
                if words[i] == "--":
                    i += 1
                    break
                if w in ("unshare",) and words[i] in ("--propagation",):
                    i += 1
                # an option that takes a value
                if w in ("timeout",) and words[i] in ("-k", "-s", "--signal", "--kill-after"):
                    i += 1
                if w in ("sudo",) and words[i] in ("-u", "-g"):
                    i += 1
                if w in ("xargs",) and words[i] in ("-n", "-P", "-I", "-d", "-L", "-s"):
                    i += 1
                if w in ("unshare", "nsenter") and words[i] in ("-t", "--target"):
                    i += 1
                i += 1
            i += skip
            continue
        return out
    return out


def scan(root):
    funcs = set()
    runners = {}
    found = {}  # command -> (file, line)
    texts = {}
    for f in host_scripts(root):
        with open(f, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")
        runners.update(runner_functions(lines))
        for line in lines:
            m = FUNC_DEF.match(line)
            if m:
                funcs.add(m.group(1))
        lines = strip_heredocs(lines)
        depth, kept = 0, []
        for line in lines:
            code = re.sub(r"(^|\s)#.*", "", line)
            opened = len(re.findall(r"\bcase\s+\S+\s+in\b", code))
            if depth + opened > 0:
                line = strip_case_patterns(line)
            depth = max(0, depth + opened - len(re.findall(r"\besac\b", code)))
            kept.append(line)
        lines = kept
        texts[f] = "\n".join(lines)
    for f, text in texts.items():
        for ln, words in segments(text):
            for c in commands_of(words, runners):
                if not NAME.match(c) or c in BUILTINS or c in KEYWORDS or c in funcs:
                    continue
                found.setdefault(c, (os.path.relpath(f, root), ln))
    return found


def read_table(path):
    table = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3:
                sys.exit(f"{path}:{n}: want COMMAND PACKAGE SOURCE, got {line!r}")
            table[parts[0]] = (parts[1], parts[2], n)
    return table


def depends_closure(pkg, depth=3):
    """PKG and what it depends on, through DEPTH levels (build-essential -> gcc -> gcc-12)."""
    seen, frontier = {pkg}, [pkg]
    for _ in range(depth):
        nxt = []
        for p in frontier:
            q = subprocess.run(["dpkg-query", "-W", "-f=${Depends},${Pre-Depends}", p],
                               capture_output=True, text=True, check=False)
            for dep in re.split(r"[,|]", q.stdout):
                name = dep.strip().split(" ", 1)[0].split(":", 1)[0]
                if name and name not in seen:
                    seen.add(name)
                    nxt.append(name)
        frontier = nxt
    return seen


def code_words(path):
    """The words of a script outside its comments."""
    words = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = re.sub(r"(^|\s)#.*", "", line)
            words.update(re.findall(r"[A-Za-z0-9][A-Za-z0-9.+-]*", line))
    return words


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    found = scan(root)
    if "--list" in sys.argv:
        for c in sorted(found):
            print(f"{c:28} {found[c][0]}:{found[c][1]}")
        return 0
    table_path = os.path.join(root, "scripts", "host-commands.txt")
    table = read_table(table_path)
    bad = []
    for c, (f, ln) in sorted(found.items()):
        if c not in table:
            bad.append(f"{f}:{ln}: runs `{c}`, which scripts/host-commands.txt does not list (what installs it?)")
    installers = {}
    for c, (pkg, src, n) in sorted(table.items()):
        where = f"scripts/host-commands.txt:{n}"
        if src.endswith(".sh"):
            script = os.path.join(root, "scripts", src)
            if not os.path.isfile(script):
                bad.append(f"{where}: `{c}`: no install script scripts/{src}")
                continue
            words = installers.setdefault(src, code_words(script))
            if pkg not in words:
                bad.append(f"{where}: `{c}` comes from package {pkg}, which scripts/{src} does not install")
        elif src == "essential":
            q = subprocess.run(
                ["dpkg-query", "-W", "-f=${Essential} ${Priority}", pkg],
                capture_output=True, text=True, check=False,
            )
            if q.returncode != 0 or not (q.stdout.startswith("yes") or q.stdout.endswith("required")):
                bad.append(f"{where}: `{c}`: package {pkg} is not Essential or required on Debian ({q.stdout.strip() or 'not installed'})")
        elif src not in ("built", "rustup", "pip", "gpu-host", "guest"):
            bad.append(f"{where}: `{c}`: unknown source {src}")
        # The package named must be the one that provides the command here.
        path = shutil.which(c)
        if path and pkg != "-" and src not in ("built", "rustup", "pip", "gpu-host", "guest"):
            real = os.path.realpath(path)
            owners = set()
            for p in {path, real, "/usr" + path if path.startswith(("/bin/", "/sbin/")) else path,
                      real.replace("/usr/bin/", "/bin/", 1), real.replace("/usr/sbin/", "/sbin/", 1)}:
                q = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True, check=False)
                if q.returncode == 0:
                    owners.update(x.split(":")[0].strip() for x in q.stdout.split(": ", 1)[0].split(","))
            if owners and not owners & depends_closure(pkg):
                bad.append(f"{where}: `{c}` ({real}) belongs to {', '.join(sorted(owners))} here, not {pkg}")
    unused = sorted(set(table) - set(found))
    for line in bad:
        print("FAIL " + line)
    print(f"{len(found)} external commands in {len(host_scripts(root))} host scripts; "
          f"{len(table)} listed; {len(bad)} problems"
          + (f"; listed but not run: {' '.join(unused)}" if unused else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
