"""The README demo recorder: a real shell under a pseudo-terminal, and asciicast -> GIF rendering."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from PIL import Image

from tools.record_demo import COLORS, FOREGROUND, Session, compress_gaps, read_cast, render_gif

# A coloured word, a progress line redrawn in place with \r, then a long pause.
CHUNKS = [(0.0, "$ "), (0.3, "\x1b[31mred\x1b[0m plain\r\n"), (0.6, "progress  10%"), (0.9, "\rprogress 100%\r\n"),
          (60.0, "done\r\n")]


def write_cast(path: pathlib.Path, cols: int, rows: int, events: list[tuple[float, str]]) -> None:
    lines = [json.dumps({"version": 2, "width": cols, "height": rows})]
    path.write_text("\n".join(lines + [json.dumps([t, "o", text]) for t, text in events]) + "\n")


def test_compress_gaps_caps_every_pause_and_keeps_order() -> None:
    assert compress_gaps([(5.0, "a"), (5.5, "b"), (65.5, "c"), (66.0, "d")], max_gap=1.5) == [
        (1.5, "a"), (2.0, "b"), (3.5, "c"), (4.0, "d")]


def test_render_gif_frames_colours_and_capped_gap(tmp_path: pathlib.Path) -> None:
    cast, gif = tmp_path / "demo.cast", tmp_path / "demo.gif"
    write_cast(cast, 40, 6, CHUNKS)
    frames = render_gif(cast, gif, fps=10, max_gap=1.5, hold=1.0)
    with Image.open(gif) as image:
        assert image.n_frames == frames > 3
        size = image.size
        durations, last = [], None
        for index in range(image.n_frames):
            image.seek(index)
            durations.append(image.info["duration"])
            last = image.convert("RGB")
    # 40 x 6 cells plus the margins; every frame has the same size.
    assert size[0] > 40 * 6 and size[1] > 6 * 10
    # 0.9 s of output, the 59 s pause cut to 1.5 s, then the 1 s hold: about 3.4 s, not a minute.
    assert 3000 <= sum(durations) <= 3800
    colours = {colour for _, colour in last.getcolors(maxcolors=1 << 16)}
    assert COLORS["red"] in colours and FOREGROUND in colours


def test_a_carriage_return_redraw_renders_like_its_final_text(tmp_path: pathlib.Path) -> None:
    redrawn, final = tmp_path / "redrawn.cast", tmp_path / "final.cast"
    write_cast(redrawn, 20, 2, [(0.0, "aaaa"), (0.5, "\rbb")])
    write_cast(final, 20, 2, [(0.0, "bbaa\b\b")])  # the same text, cursor on the third cell
    for cast in (redrawn, final):
        render_gif(cast, cast.with_suffix(".gif"), fps=4, hold=0.5)
    with Image.open(redrawn.with_suffix(".gif")) as a, Image.open(final.with_suffix(".gif")) as b:
        a.seek(a.n_frames - 1)
        assert a.n_frames == 2 and b.n_frames == 1
        assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


def test_read_cast_rejects_other_formats(tmp_path: pathlib.Path) -> None:
    cast = tmp_path / "v1.cast"
    cast.write_text(json.dumps({"version": 1}) + "\n")
    with pytest.raises(ValueError, match="asciicast v2"):
        read_cast(cast)


@pytest.mark.skipif(shutil.which("bash") is None, reason="the recorder drives bash")
def test_session_records_a_typed_command_and_its_output(tmp_path: pathlib.Path) -> None:
    session = Session(cols=50, rows=8, type_delay=0.0)
    try:
        output = session.run("printf 'a\\nb\\n'", timeout=30)
    finally:
        session.close()
    assert "a\r\nb\r\n" in output and output.endswith("$ ")
    text = "".join(chunk for _, chunk in session.events)
    assert "printf 'a\\nb\\n'" in text  # the shell's echo of the keystrokes
    assert text.rstrip().endswith("exit")
    times = [t for t, _ in session.events]
    assert times == sorted(times) and times[0] >= 0
    session.write_cast(tmp_path / "s.cast")
    assert read_cast(tmp_path / "s.cast") == (50, 8, [(round(t, 6), chunk) for t, chunk in session.events])


@pytest.mark.skipif(shutil.which("bash") is None, reason="the recorder drives bash")
def test_session_returns_after_an_empty_command() -> None:
    session = Session(cols=50, rows=8, type_delay=0.0)
    try:
        assert session.run("", timeout=30).endswith("$ ")
    finally:
        session.close()
