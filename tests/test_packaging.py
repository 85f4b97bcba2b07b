"""What a new user installs and runs (issue 26): ``make run`` installs the chat's dependencies
and no development tool, ``make test`` everything, and the resume hint names a command that
runs from where the chat was started.

The Makefile is read through ``make -n`` (what it would run, executing nothing) with the venv
pointed at an empty folder, so the install recipes are printed in full.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fakeserver import FakeServer

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned(target: str, venv: Path) -> list[str]:
    """The commands ``make TARGET`` would run on a machine without ``venv``."""
    # Not a sub-make of the `make test` running this: no inherited flags, no directory lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    """What each ``pip install`` among ``commands`` installs (its last argument)."""
    return [
        command.split()[-1].strip("'\"")
        for command in commands
        if re.search(r"\bpip install\b", command) and "--upgrade pip" not in command
    ]


def project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]  # type: ignore[no-any-return]


def names(requirements: object) -> set[str]:
    assert isinstance(requirements, list)
    return {re.split(r"[\[<>=!~ ;]", str(r), maxsplit=1)[0].lower() for r in requirements}


def test_make_run_installs_the_package_without_extras(tmp_path: Path) -> None:
    """``make run`` installs the package alone (its base dependencies), then starts the chat."""
    commands = planned("run", tmp_path / "venv")
    assert installs(commands) == ["."], commands
    assert commands[-1] == f"{tmp_path / 'venv'}/bin/terrarium chat"


def test_make_test_installs_the_dev_extra(tmp_path: Path) -> None:
    commands = planned("test", tmp_path / "venv")
    assert installs(commands) == [".[dev]"], commands


def test_the_chats_dependencies_hold_no_development_tool() -> None:
    """What ``make run`` brings in: no linter, type checker, test runner or browser driver."""
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict)
    tools = {"ruff", "mypy", "pytest", "pytest-timeout", "hypothesis", "pexpect", "playwright"}
    assert tools <= names(extras["dev"])
    assert not tools & names(project()["dependencies"])


# --------------------------------------------------------------------------- the resume hint


def console_script() -> Path:
    """This venv's ``terrarium`` (pip's console script)."""
    script = Path(sys.executable).parent / "terrarium"
    if not script.exists():
        pytest.skip(f"no console script at {script}: install the package (pip install -e .)")
    return script


def chat_once(cwd: Path, program: str, path: str, base_url: str) -> str:
    """``PROGRAM chat cli:demo -p hi`` run from ``cwd`` with ``PATH``; its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    env.update(PATH=path, TERRARIUM_BASE_URL=base_url)
    done = subprocess.run(
        [program, "chat", "cli:demo", "-p", "hi"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_resume_hint_names_the_program_as_run_when_path_has_no_terrarium(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    """``make run`` starts ``.venv/bin/terrarium`` with no ``terrarium`` on PATH: the hint
    must be a command that works when pasted there, so it names that path."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "terrarium").symlink_to(console_script())
    plain = "/usr/bin:/bin"
    assert shutil.which("terrarium", path=plain) is None
    stderr = chat_once(tmp_path, ".venv/bin/terrarium", plain, fake_server.base_url)
    assert stderr.splitlines()[-1] == "resume with: .venv/bin/terrarium chat cli:demo"
    # With the venv on PATH (an activated venv), the bare name works and is what it says.
    stderr = chat_once(tmp_path, ".venv/bin/terrarium", f"{bin_dir}:{plain}", fake_server.base_url)
    assert stderr.splitlines()[-1] == "resume with: terrarium chat cli:demo"


def test_chat_py_names_a_resume_command_that_works_without_terrarium_on_path(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    """``python chat.py`` said ``resume with: terrarium chat ...`` with no ``terrarium`` on
    PATH. It names the ``terrarium`` installed beside its Python (the venv's): the note
    pasted into a shell resumes the chat, and a failed turn's note names it for ``--retry``,
    ``compact`` and ``rewind`` too. With that folder on PATH, the bare name."""
    script = console_script()
    plain = "/usr/bin:/bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    env.update(PATH=plain, TERRARIUM_BASE_URL=fake_server.base_url)

    def run(args: list[str], stdin: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, input=stdin, cwd=tmp_path, env={**env, **more}, capture_output=True, text=True
        )

    chat_py = [sys.executable, str(ROOT / "chat.py"), "--session-id", "demo"]
    hint = run(chat_py, "hi\n").stderr.splitlines()[-1]
    assert hint == f"resume with: {script} chat cli:demo"
    again = run(["/bin/sh", "-c", hint.removeprefix("resume with: ")], "more\n")
    assert again.stdout == "echo: more\n", again.stderr
    fake_server.context_window = 50  # a failed turn's note names the same command throughout
    note = run(chat_py, "too long " * 40 + "\n").stderr
    for command in ("chat cli:demo --retry", "compact cli:demo", "rewind cli:demo -n N"):
        assert f"'{script} {command}'" in note
    fake_server.context_window = None
    on_path = run(chat_py, "hi\n", PATH=f"{script.parent}:{plain}")
    assert on_path.stderr.splitlines()[-1] == "resume with: terrarium chat cli:demo"


# --------------------------------------------------------------------------- the distribution

#: Names on the package index that belong to other projects: ``pip install`` of one of them
#: would install that project (``terrarium``: "Package and ship relocatable Python virtual
#: environments", 2019).
TAKEN = {"terrarium"}

#: Where users read install commands: the docs, and the messages the code prints.
DOC_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks/README.md",
]
PIP_INSTALL = re.compile(r"pip install\s+(?:-{1,2}[\w-]+\s+)*(['\"]?)([^\s'\"`)]+)\1")


def install_commands(text: str) -> list[str]:
    """What each ``pip install`` in ``text`` installs: ``NAME[extra]``, ``.[dev]``, ``.``."""
    return [match.group(2) for match in PIP_INSTALL.finditer(text)]


def test_install_commands_extract_what_they_install() -> None:
    text = "run `pip install 'x-y[web]'`, pip install -e '.[bench]' or pip install foo[a,b])"
    assert install_commands(text) == ["x-y[web]", ".[bench]", "foo[a,b]"]


def test_the_distribution_name_is_ours_and_every_install_command_uses_it() -> None:
    """Every ``pip install`` of this project in the docs and in the code's messages names the
    distribution of pyproject.toml (not a name another project holds) and an extra it has."""
    name = str(project()["name"])
    assert name.lower() not in TAKEN
    from terrarium.errors import DISTRIBUTION, install_hint

    assert DISTRIBUTION == name and install_hint("web") == f"pip install '{name}[web]'"
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict)
    sources = [*DOC_FILES, *sorted((ROOT / "src").rglob("*.py")), ROOT / "chat.py"]
    seen = 0
    for source in sources:
        for requirement in install_commands(source.read_text(encoding="utf-8")):
            target, _, extra = requirement.partition("[")
            if not (target.startswith(".") or target.lower().startswith("terrarium")):
                continue  # another project's package (llama-cpp-python, ...)
            seen += 1
            where = f"{source.relative_to(ROOT)}: pip install {requirement}"
            assert target in (".", name), where
            for wanted in filter(None, extra.rstrip("]").split(",")):
                assert wanted in extras, f"{where}: no extra {wanted!r} in pyproject.toml"
    assert seen >= 10  # the docs were read: README, cli.md, dashboard.md, integrations.md ...
