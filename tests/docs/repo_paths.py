"""Finds the paths a repository's files point at: Markdown links, and paths named in comments.

A fresh clone must be self-contained: every relative link and every repository path in a
comment has to exist in the clone and stay inside it. `problems(root)` lists the ones that do
not, as "file:line: path (why)".
"""
from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from dataclasses import dataclass

# Markdown: [text](target) and ![alt](target), and reference definitions "[id]: target".
MD_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MD_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
# A path-like token in a comment: two or more components separated by '/'.
PATH_TOKEN = re.compile(r"(?<![\w/.:@$<{-])((?:\.\.?/)*[\w.+-]+(?:/[\w.+-]+)+/?)")
# A path followed by one of these is a pattern or a template, not a path.
PATTERN_FOLLOWERS = set("*<{$[")
FILE_EXTENSIONS = {"md", "h", "cc", "cu", "py", "proto", "json", "yaml", "yml", "sh", "txt",
                   "safetensors", "mjs", "png", "cmake"}
# protoc writes these into the build tree from proto/.
GENERATED_SUFFIXES = (".pb.h", ".pb.cc", "_pb2.py", "_pb2_grpc.py")
C_LIKE = {".h", ".cc", ".cu", ".proto", ".mjs"}
HASH_COMMENTS = {".sh", ".yaml", ".yml", ".txt", ".cmake", ".toml"}
HASH_NAMES = {"Dockerfile", "CMakeLists.txt", ".gitignore", ".dockerignore", "run", "serve", "test"}


@dataclass(frozen=True)
class Ref:
    file: str  # relative to the root
    line: int
    target: str
    markdown: bool  # a Markdown link (resolved from the file's folder) or a comment path


def tracked_files(root: str) -> list[str]:
    """The files a clone has: git's index when root is a work tree, else everything on disk."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in (".git", "build", "node_modules")]
            found += [os.path.relpath(os.path.join(folder, f), root) for f in files]
        return found


def markdown_refs(path: str, text: str) -> list[Ref]:
    refs, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        spans = re.findall(r"`([^`]*)`", line)
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links...
        targets = MD_INLINE.findall(line) + MD_REFERENCE.findall(line)
        targets += [s for s in spans if re.fullmatch(r"\.\.?/\S+", s)]  # ...unless relative
        refs += [Ref(path, n, t, True) for t in targets]
    return refs


def python_comments(text: str) -> list[tuple[int, str]]:
    """# comments and docstrings, with their first line numbers."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)):
                    for i, line in enumerate(first.value.value.splitlines()):
                        out.append((first.lineno + i, line))
    except (SyntaxError, tokenize.TokenError):
        pass
    return out


def c_comments(text: str) -> list[tuple[int, str]]:
    out, in_block = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if in_block:
            end = line.find("*/")
            out.append((n, line if end < 0 else line[:end]))
            in_block = end < 0
            continue
        if (start := line.find("/*")) >= 0 and "//" not in line[:start]:
            end = line.find("*/", start + 2)
            out.append((n, line[start + 2:] if end < 0 else line[start + 2:end]))
            in_block = end < 0
        m = re.search(r"(?<![:\"'])//(.*)", line)
        if m:
            out.append((n, m.group(1)))
    return out


def hash_comments(text: str) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|\s)#(.*)", line)
        if m and not line.startswith("#!"):
            out.append((n, m.group(1)))
    return out


def comments_of(path: str, text: str) -> list[tuple[int, str]]:
    ext, name = os.path.splitext(path)[1], os.path.basename(path)
    if ext == ".py":
        return python_comments(text)
    if ext in C_LIKE:
        return c_comments(text)
    if ext in HASH_COMMENTS or name in HASH_NAMES:
        return hash_comments(text)
    return []


def looks_like_repo_path(token: str, top_level: set[str]) -> bool:
    """Relative paths with ./ or ../, paths under a top-level folder, and names of files."""
    if token.startswith(("./", "../")):
        return True
    first = token.split("/", 1)[0]
    last = token.rstrip("/").rsplit("/", 1)[-1]
    return first in top_level or last.rsplit(".", 1)[-1] in FILE_EXTENSIONS and "." in last


def comment_refs(path: str, text: str, top_level: set[str]) -> list[Ref]:
    refs = []
    for n, comment in comments_of(path, text):
        for m in PATH_TOKEN.finditer(comment):
            token = m.group(1).rstrip(".,;:")
            follower = comment[m.end():m.end() + 1]
            if follower in PATTERN_FOLLOWERS or not looks_like_repo_path(token, top_level):
                continue
            refs.append(Ref(path, n, token, False))
    return refs


def ignored(root: str, paths: list[str]) -> set[str]:
    """The paths that .gitignore marks as outputs (run results, checkpoints, builds)."""
    if not paths:
        return set()
    # A missing folder is not known to be one: ask for "p/" too, so that "out/" patterns match.
    asked = [q for p in paths for q in (p, p + "/")]
    try:
        out = subprocess.run(["git", "-C", root, "check-ignore", "--no-index", "--stdin", "-z"],
                             input="\0".join(asked).encode() + b"\0", capture_output=True)
        return {p.rstrip("/") for p in out.stdout.decode().split("\0") if p}
    except OSError:
        return set()


def resolve(root: str, ref: Ref) -> tuple[str | None, str, list[str]]:
    """The path inside root that ref names, or None with the reason it names none and the
    candidates inside root that were tried."""
    target = ref.target.split("#", 1)[0].split("?", 1)[0]
    if not target:
        return "", "", []  # an anchor in the same page
    if os.path.isabs(target):
        return None, "absolute path", []
    here = os.path.dirname(ref.file)
    candidates = [os.path.normpath(os.path.join(here, target))]
    if not ref.markdown and not target.startswith(("./", "../")):
        candidates.append(os.path.normpath(target))  # comments name paths from the root
    inside = [c for c in candidates if not c.startswith("..")]
    if not inside:
        return None, "leaves the repository", []
    for c in inside:
        if os.path.exists(os.path.join(root, c)):
            return c, "", inside
    return None, "does not exist", inside


def refs_of(root: str, files: list[str]) -> list[Ref]:
    top_level = {f.split("/", 1)[0] for f in files if "/" in f}
    refs = []
    for f in files:
        try:
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue  # binary files name no paths
        if f.endswith(".md"):
            refs += markdown_refs(f, text)
        refs += comment_refs(f, text, top_level)
    return refs


def is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None  # http:, mailto:, ...


def problems(root: str, files: list[str] | None = None) -> list[str]:
    files = tracked_files(root) if files is None else files
    missing = []
    for ref in refs_of(root, files):
        if is_external(ref.target) or ref.target.endswith(GENERATED_SUFFIXES):
            continue
        found, why, tried = resolve(root, ref)
        if found is None:
            missing.append((ref, why, tried))
    outputs = ignored(root, [c for _, _, tried in missing for c in tried])
    return [f"{ref.file}:{ref.line}: {ref.target} ({why})" for ref, why, tried in missing
            if not (why == "does not exist" and outputs.intersection(tried))]
