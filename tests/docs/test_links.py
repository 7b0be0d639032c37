"""A fresh clone has no link or comment path that leaves the repository or names nothing."""
import os
import subprocess

import pytest

from repo_paths import problems

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_link_and_comment_path_resolves_inside_the_repository():
    found = problems(REPO)
    assert not found, "paths that a clone cannot follow:\n" + "\n".join(found)


FILES = {
    "README.md": "See [the spec](../shared/FPA.md), [docs](docs/a.md), [gone](docs/gone.md),\n"
                 "[web](https://example.com), [anchor](#set-up), `../outside.md`.\n"
                 "```\n[not a link](../in/a/fence.md)\n```\n",
    "docs/a.md": "[back](../README.md) [self](a.md#top)\n",
    "src/x.h": "// The math (../shared/FPA.md section 2); see src/y.cc and docs/a.md.\n"
               "// Results land in out/run.json; tests/*.py are globs.\n"
               'const char* url = "http://x/y.md";  // not a comment path: http://a/b.md\n',
    "src/y.cc": "/* spans\n   lines: docs/missing.md */\nint y;\n",
    "tool.py": '"""Reads src/nothing.py."""\n# writes out/result.json\nx = "src/not/a/comment.h"\n',
    ".gitignore": "/out/\n",
}


@pytest.fixture
def sample_repo(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    return str(tmp_path)


def test_the_checker_flags_what_leaves_or_is_missing(sample_repo):
    assert sorted(problems(sample_repo)) == sorted([
        "README.md:1: ../shared/FPA.md (leaves the repository)",
        "README.md:1: docs/gone.md (does not exist)",
        "README.md:2: ../outside.md (leaves the repository)",
        "src/x.h:1: ../shared/FPA.md (does not exist)",
        "src/y.cc:2: docs/missing.md (does not exist)",
        "tool.py:1: src/nothing.py (does not exist)",
    ])
