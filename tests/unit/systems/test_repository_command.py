"""The `command` route runs without a shell: every template x prompt case hands the prompt to
the command byte-exact, or the template is refused at setup with a pointer to the list form.

The command is a real subprocess (tests/fakes/checkouts.py record_argv.py) that writes the
bytes of the arguments it received to a file.
"""

from __future__ import annotations

import sys

import pytest

from tests.fakes.checkouts import argv_checkout, kimi_checkout, kimi_weights
from tests.fakes.stimuli import make_stimuli
from voicebias.errors import SetupError
from voicebias.systems.base import S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.tasks import load_tasks

PROMPTS = {
    "summarize": load_tasks()["summarize"].prompt("en"),  # holds 'he' or 'she'
    "quotes": """say "he" or 'she', it's 'quoted'""",
    "command substitution": "$(touch pwned-dollar) and $HOME",
    "backticks": "`touch pwned-backtick` done",
    "mandarin": "请用一句话概括说话人讲了什么：用“他”或“她”。",
    "spanish": "¿Quién habló? Él o ella; acentos: á é í ó ú ü ñ",
    "newlines": "line one\nline two\n\n  indented\ttab\n",
    "braces and backslashes": "{seed} {{prompt}} C:\\path\\ \\n \\\\",
    "shell words": "a | b > c && d; e * ? [x] ~ # not a comment",
    "spaces only": "   ",
}

# template -> the words after the output path it hands the command, with P the prompt
TEMPLATES = {
    "list": (["python", "record_argv.py", "{out}", "{prompt}"], lambda p: [p]),
    "list, placeholder inside a word": (
        ["python", "record_argv.py", "{out}", "--prompt={prompt}", "{seed}"],
        lambda p: [f"--prompt={p}", "7"],
    ),
    "string, bare": ("python record_argv.py {out} {prompt}", lambda p: [p]),
    "string, double-quoted": ('python record_argv.py "{out}" "{prompt}"', lambda p: [p]),
    "string, single-quoted": ("python record_argv.py '{out}' '{prompt}'", lambda p: [p]),
    "string, inside a word": (
        "python record_argv.py {out} --prompt={prompt} --seed={seed}",
        lambda p: [f"--prompt={p}", "--seed=7"],
    ),
    "string, quoted words around it": (
        "python record_argv.py {out} 'the prompt: {prompt}' \"a b\" '$HOME' x\\|y",
        lambda p: [f"the prompt: {p}", "a b", "$HOME", "x|y"],
    ),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("command")
    checkout = argv_checkout(kimi_checkout(root / "external" / "Kimi-Audio"))
    kimi_weights(root / "models" / "weights" / "Kimi-Audio-7B-Instruct")
    stim = make_stimuli(root, 1).iloc[0]
    return root, checkout, stim


def system(root, command):
    return build_system("kimi_audio", {"python": sys.executable, "command": command}, root=root)


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_prompt_reaches_the_command_byte_exact(project, template, prompt):
    root, checkout, s = project
    (checkout / "received.bin").unlink(missing_ok=True)
    words, expected = TEMPLATES[template]
    text = PROMPTS[prompt]
    sut = system(root, words)
    try:
        resp = sut.respond(S2SRequest(s.stimulus_id, "en", "en", "summarize", text, str(root / s.path), s.sha256, 7))
    finally:
        sut.close()
    assert resp.status == "ok", resp.error
    received = (checkout / "received.bin").read_bytes().split(b"\0")
    assert received == [w.encode("utf-8") for w in expected(text)]
    assert not list(checkout.glob("pwned*")) and not list(root.glob("pwned*"))  # nothing in the prompt ran


@pytest.mark.parametrize(
    "template,named",
    [
        ("python record_argv.py {out} {prompt} | tee log.txt", "'|'"),
        ("python record_argv.py {out} {prompt} > log.txt", "'>'"),
        ("python record_argv.py {out} {prompt} 2>&1", "'>'"),
        ("python record_argv.py {out} {prompt} && echo done", "'&'"),
        ("python record_argv.py {out} {prompt}; rm -f x", "';'"),
        ("python record_argv.py {out} $HOME", "'$'"),
        ('python record_argv.py {out} "$HOME/{prompt}"', "'$' inside double quotes"),
        ("python record_argv.py {out} `id`", "'`'"),
        ("python record_argv.py {out} $(id)", "'$'"),
        ("python record_argv.py {out} *.wav", "'*'"),
        ("python record_argv.py {out} ~/x", "'~'"),
        ("python record_argv.py {out}\npython other.py", "a line break"),
        ("LANG=C python record_argv.py {out}", "a variable assignment (LANG=C)"),
    ],
)
def test_a_string_template_with_shell_syntax_is_refused_with_the_list_form(project, template, named):
    root, _, _ = project
    with pytest.raises(SetupError) as err:
        system(root, template)
    msg = str(err.value)
    assert f"shell syntax ({named})" in msg and "as a list of words" in msg and "[python, run.py" in msg


UNSPLIT = r"cannot be split into words \(No closing quotation\).*as a list of words"


@pytest.mark.parametrize(
    "template,match",
    [
        ("python record_argv.py {out} 'unbalanced {prompt}", UNSPLIT),
        ('python record_argv.py {out} "{prompt}', UNSPLIT),
        ("python record_argv.py {out} {voice}", r"unknown placeholder\(s\) \{voice\}"),
        (["python", "record_argv.py", "{out}", "{prompt"], "not a valid template"),
        ("   ", "is empty"),
    ],
)
def test_a_template_that_cannot_be_read_is_refused_at_setup(project, template, match):
    root, _, _ = project
    with pytest.raises(SetupError, match=match):
        system(root, template)


def test_a_command_that_cannot_start_stops_the_stage_with_its_name(project):
    root, _, s = project
    sut = system(root, ["no-such-program-here", "{out}"])
    try:
        with pytest.raises(SetupError, match="cannot be started: no-such-program-here"):
            sut.respond(S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(root / s.path), s.sha256, 1))
    finally:
        sut.close()
