"""Prompts that are not text (issue 28): a lone surrogate — bytes that were not UTF-8 on a command line
(``surrogateescape``), half of an emoji cut off by a client — is refused where the prompt enters (``check_prompt``,
``EditSettings``, the CLIs) with the position and the fix; main accepted it and failed later."""

import pytest

from sakura_core.cli import main
from sakura_core.edit import EditSettings
from sakura_core.limits import MAX_PROMPT_CHARS, LimitError, check_prompt


@pytest.mark.parametrize("prompt, at", [("\ud800", 0), ("swap the face \ud83d", 14), ("ok \udcff\udcfe", 3)])
def test_a_lone_surrogate_is_refused_naming_where_and_the_fix(prompt, at):
    with pytest.raises(LimitError, match=rf"character {at} is U\+D[89A-F][0-9A-F]{{2}}, a lone surrogate.*again"):
        check_prompt(prompt)
    with pytest.raises(ValueError, match="lone surrogate"):
        EditSettings(prompt)


def test_text_passes_and_other_bad_prompts_are_refused():
    for ok in ("", "swap the face 🙂 ünïcödé", "x" * MAX_PROMPT_CHARS):
        assert check_prompt(ok) == ok and EditSettings(ok).prompt == ok
    with pytest.raises(LimitError, match="the prompt's length in characters is 4097, over the limit of 4096"):
        check_prompt("x" * (MAX_PROMPT_CHARS + 1))
    with pytest.raises(LimitError, match="the prompt must be text"):
        check_prompt(b"bytes")


def test_sakura_phone_run_refuses_it_before_connecting(tmp_path, capsys):
    from sakura_core.files import save_png

    image = tmp_path / "u.png"
    save_png(image, __import__("numpy").zeros((8, 8, 3), "uint8"))
    argv = [
        "phone",
        "run",
        "--agent",
        "http://127.0.0.1:9",
        "--token",
        "pairing-token-0",
        "--cloud",
        "http://127.0.0.1:9",
        "--template",
        "tpl",
        "--image",
        str(image),
        "--prompt",
        "b\udcffad",
        "--out",
        str(tmp_path / "o.png"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sakura phone run: the prompt is not valid Unicode text: character 1 is U+DCFF"), err
    assert "Traceback" not in err and not (tmp_path / "o.png").exists()


def test_sakura_demo_refuses_it_first(tmp_path):
    with pytest.raises(SystemExit, match=r"sakura demo: --prompt: the prompt is not valid Unicode text"):
        main(["demo", "--out", str(tmp_path / "out"), "--prompt", "\udcff", "--no-served"])
    assert not (tmp_path / "out").exists()  # refused before the output folder was made
