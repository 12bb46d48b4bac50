"""Record the README demo from a real terminal session and render it to an animated GIF.

    python tools/record_demo.py --out docs/images/demo.gif         # record (about a minute) and render
    python tools/record_demo.py --out docs/images/demo.gif --render-only   # re-render the kept .cast

Key design choice: nothing is mocked. An interactive bash runs under a pseudo-terminal of a fixed size;
the script types each command into it keystroke by keystroke (bash's own echo shows them), starts the
server in the background with `&`, waits for its /health, and stops it with `kill %1`. Every output chunk
is kept with its time in an asciicast-v2 file next to the GIF; the GIF is rendered from that file only,
through the pyte terminal emulator and Pillow, with idle gaps capped. Needs the `.[test]` extra.
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

try:
    import pyte
    from PIL import Image, ImageDraw, ImageFont
except ImportError as error:  # tools/ may rely on runtime packages only; these come with the `demo` extra
    raise ImportError(f"{error}: tools/record_demo.py needs the demo extra; pip install -e '.[test]' installs it "
                      "and what the recorded session runs (the benchmark, the OpenAI SDK)") from error

ROOT = Path(__file__).resolve().parents[1]
# The prompt, last in the output, is what ends a command: at a line start, or after the escape with which
# bash 5.1+ turns bracketed paste back on before each prompt.
_PROMPT = re.compile(r"(?:\A|[\r\n]|\x1b\[\?2004h)\$ \Z")
Event = tuple[float, str]


class Session:
    """An interactive bash under a pseudo-terminal of `cols` x `rows`; `events` is every output chunk."""

    def __init__(self, cols: int, rows: int, cwd: Path = ROOT, type_delay: float = 0.025) -> None:
        self.cols, self.rows, self.type_delay = cols, rows, type_delay
        self.events: list[Event] = []
        self._text = ""
        self._changed = threading.Condition()
        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        # `python` is this interpreter, so the session runs the environment the script was started from.
        env = {**os.environ, "PS1": "$ ", "TERM": "xterm-256color", "HISTFILE": "/dev/null",
               "COLUMNS": str(cols), "LINES": str(rows),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("PROMPT_COMMAND", None)
        self.shell = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave,
                                      stderr=slave, cwd=cwd, env=env, start_new_session=True)
        os.close(slave)
        self._start = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for_prompt(0, timeout=30)

    def _read(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                data = b""
            text = decoder.decode(data, final=not data)
            with self._changed:
                if text:
                    self.events.append((time.monotonic() - self._start, text))
                    self._text += text
                if not data:
                    self._text += "\0"  # end of output; no prompt will ever follow
                self._changed.notify_all()
            if not data:
                return

    @property
    def mark(self) -> int:
        """Where the output is now; pass it to the wait_for_* calls to look only at what follows."""
        with self._changed:
            return len(self._text)

    def wait_for(self, pattern: re.Pattern[str], since: int, timeout: float) -> str:
        """Block until the output after `since` matches `pattern`; return that output."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not pattern.search(self._text, since):
                left = deadline - time.monotonic()
                if left <= 0 or self._text.endswith("\0"):
                    raise TimeoutError(f"no {pattern.pattern!r} within {timeout:.0f} s; the output ends with "
                                       f"{self._text[-500:]!r}")
                self._changed.wait(left)
            return self._text[since:]

    def wait_for_prompt(self, since: int, timeout: float) -> str:
        return self.wait_for(_PROMPT, since, timeout)

    def wait_quiet(self, seconds: float, timeout: float) -> None:
        """Block until no output has arrived for `seconds`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._changed:
                last = self.events[-1][0] if self.events else 0.0
            if time.monotonic() - self._start - last >= seconds:
                return
            time.sleep(seconds / 4)
        raise TimeoutError(f"the output did not pause for {seconds} s within {timeout:.0f} s")

    def type(self, keys: str) -> None:
        for key in keys:
            os.write(self._master, key.encode())
            time.sleep(self.type_delay)

    def run(self, command: str, timeout: float = 300) -> str:
        """Type `command`, press Enter and wait for the next prompt; return the output in between."""
        self.type(command)
        since = self.mark
        self.type("\r")
        return self.wait_for_prompt(since, timeout)

    def close(self, timeout: float = 30) -> None:
        """`exit` the shell (killing it if it does not go) and wait for the last output."""
        if self.shell.poll() is None:
            self.type("exit\r")
        try:
            self.shell.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.shell.pid, 9)
            self.shell.wait()
        self._reader.join(timeout)
        os.close(self._master)

    def write_cast(self, path: Path) -> None:
        """Save the recording as asciicast v2: a header line, then one `[time, "o", text]` line per chunk."""
        header = {"version": 2, "width": self.cols, "height": self.rows, "timestamp": int(time.time()),
                  "env": {"SHELL": "bash", "TERM": "xterm-256color"}}
        lines = [json.dumps(header)] + [json.dumps([round(t, 6), "o", text]) for t, text in self.events]
        path.write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_for_health(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server on port {port} did not answer /health within {timeout:.0f} s")
        time.sleep(0.5)


def record_demo(cols: int, rows: int, port: int) -> Session:
    """Start the demo server, stream a completion, run a short benchmark, stop the server."""
    session = Session(cols, rows)
    server_pid = None
    try:
        started = session.run(f"python -m rapid_llm.launch_server --port {port} &")
        server_pid = int(re.search(r"\[1\] (\d+)", started)[1])
        wait_for_health(port, timeout=600)
        session.wait_quiet(1.0, timeout=30)
        session.run("")  # Enter: a fresh prompt under the server's start-up lines
        session.run(f"python -c \"from openai import OpenAI; stream = OpenAI(base_url='http://127.0.0.1:{port}/v1', "
                    "api_key='-').completions.create(model='demo-target', prompt='def read_lines(self', "
                    "max_tokens=64, stream=True); [print(c.choices[0].text, end='', flush=True) for c in stream]; "
                    "print()\"")
        session.run(f"python benchmarks/bench_serving.py --port {port} --dataset-name random --num-prompts 16 "
                    "--random-input-len 64 --random-output-len 32 --max-concurrency 4 --percentile-metrics ttft,tpot",
                    timeout=600)
        session.run("kill %1 && wait", timeout=120)
        server_pid = None
    finally:
        if server_pid is not None:  # a step failed: do not leave the server running
            try:
                os.killpg(server_pid, 15)
            except ProcessLookupError:
                pass
        session.close()
    return session


# xterm's default colours, normal then bright; pyte names SGR 33 "brown".
_ANSI = ["black", "red", "green", "brown", "blue", "magenta", "cyan", "white"]
_RGB = [(0x1e, 0x1e, 0x1e), (0xcd, 0x31, 0x31), (0x0d, 0xbc, 0x79), (0xe5, 0xe5, 0x10), (0x24, 0x72, 0xc8),
        (0xbc, 0x3f, 0xbc), (0x11, 0xa8, 0xcd), (0xe5, 0xe5, 0xe5), (0x66, 0x66, 0x66), (0xf1, 0x4c, 0x4c),
        (0x23, 0xd1, 0x8b), (0xf5, 0xf5, 0x43), (0x3b, 0x8e, 0xea), (0xd6, 0x70, 0xd6), (0x29, 0xb8, 0xdb),
        (0xff, 0xff, 0xff)]
COLORS = {**dict(zip(_ANSI, _RGB)), **{f"bright{n}": c for n, c in zip(_ANSI, _RGB[8:])}}
FOREGROUND, BACKGROUND = (0xd4, 0xd4, 0xd4), (0x1e, 0x1e, 0x1e)


def _palette_image() -> Image.Image:
    """A fixed palette: the 16 colours plus default-foreground blends for antialiased glyph edges."""
    colors = [FOREGROUND, BACKGROUND, *_RGB]
    colors += [tuple(round(b + (f - b) * k / 6) for f, b in zip(FOREGROUND, BACKGROUND)) for k in range(1, 6)]
    image = Image.new("P", (1, 1))
    image.putpalette([v for color in colors for v in color] + [0] * (768 - 3 * len(colors)))
    return image


def _rgb(color: str, default: tuple[int, int, int], bold: bool = False) -> tuple[int, int, int]:
    if color == "default":
        return default
    if color in COLORS:
        return COLORS[f"bright{color}"] if bold and color in _ANSI else COLORS[color]
    return tuple(int(color[i:i + 2], 16) for i in (0, 2, 4))  # pyte's 256-colour and truecolour hex


def load_font(size: int, path: str | None = None) -> ImageFont.FreeTypeFont:
    """`path`, else DejaVu Sans Mono from the system fonts or from matplotlib's bundled copy."""
    candidates = [path] if path else ["DejaVuSansMono.ttf"]
    try:
        import matplotlib
        candidates.append(str(Path(matplotlib.__file__).parent / "mpl-data/fonts/ttf/DejaVuSansMono.ttf"))
    except ImportError:
        pass
    for candidate in candidates:
        try:
            return ImageFont.truetype(candidate, size)
        except OSError:
            continue
    raise FileNotFoundError(f"no monospace font among {candidates}; pass --font PATH.ttf")


def render_screen(screen: pyte.Screen, font: ImageFont.FreeTypeFont) -> Image.Image:
    """One frame: every cell with its colours, bold as bright, reverse video, and a block cursor."""
    cell_w, cell_h = round(font.getlength("M")), round(sum(font.getmetrics()))
    image = Image.new("RGB", (screen.columns * cell_w + 2 * cell_w, screen.lines * cell_h + cell_h), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cursor = None if screen.cursor.hidden else (screen.cursor.x, screen.cursor.y)
    for y in range(screen.lines):
        row = screen.buffer[y]
        for x in range(screen.columns):
            char = row[x]
            fg, bg = _rgb(char.fg, FOREGROUND, char.bold), _rgb(char.bg, BACKGROUND)
            if char.reverse != ((x, y) == cursor):
                fg, bg = bg, fg
            px, py = cell_w + x * cell_w, cell_h // 2 + y * cell_h
            if bg != BACKGROUND:
                draw.rectangle([px, py, px + cell_w - 1, py + cell_h - 1], fill=bg)
            if char.data.strip():
                draw.text((px, py), char.data, font=font, fill=fg)
    return image


def compress_gaps(events: Sequence[Event], max_gap: float) -> list[Event]:
    """The same chunks with every pause between two of them (and before the first) cut to `max_gap`."""
    result, previous, shift = [], 0.0, 0.0
    for t, text in events:
        shift += max(0.0, t - previous - max_gap)
        result.append((t - shift, text))
        previous = t
    return result


def render_frames(cols: int, rows: int, events: Sequence[Event], font: ImageFont.FreeTypeFont, fps: float,
                  hold: float) -> list[tuple[Image.Image, int]]:
    """(palette frame, duration in ms) sampled every 1/fps s; unchanged screens lengthen the last frame."""
    screen = pyte.Screen(cols, rows)
    stream = pyte.Stream(screen)
    palette, frames, state, index = _palette_image(), [], None, 0
    step_ms = round(1000 / fps)
    end = events[-1][0] if events else 0.0
    for k in range(int(end * fps) + 2):
        while index < len(events) and events[index][0] <= k / fps:
            stream.feed(events[index][1])
            index += 1
        now = (tuple(screen.display), screen.cursor.x, screen.cursor.y, screen.cursor.hidden)
        if now == state:
            frames[-1][1] += step_ms
            continue
        state = now
        frames.append([render_screen(screen, font).quantize(palette=palette, dither=Image.Dither.NONE), step_ms])
    frames[-1][1] += round(hold * 1000)
    return [(image, duration) for image, duration in frames]


def read_cast(path: Path) -> tuple[int, int, list[Event]]:
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    if header.get("version") != 2:
        raise ValueError(f"{path}: not an asciicast v2 file (header {lines[0][:80]!r})")
    events = [(float(t), text) for t, kind, text in map(json.loads, lines[1:]) if kind == "o"]
    return header["width"], header["height"], events


def render_gif(cast: Path, out: Path, fps: float = 8, max_gap: float = 1.5, hold: float = 3.0,
               font_size: int = 13, font_path: str | None = None) -> int:
    """Render an asciicast v2 file to an animated GIF; return the number of frames."""
    cols, rows, events = read_cast(cast)
    frames = render_frames(cols, rows, compress_gaps(events, max_gap), load_font(font_size, font_path), fps, hold)
    frames[0][0].save(out, save_all=True, append_images=[image for image, _ in frames[1:]], loop=0,
                      duration=[duration for _, duration in frames], optimize=False, disposal=1)
    return len(frames)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images/demo.gif",
                        help="the GIF; the raw recording goes next to it with the suffix .cast")
    parser.add_argument("--render-only", action="store_true", help="re-render the existing .cast, record nothing")
    parser.add_argument("--cols", type=int, default=100)
    parser.add_argument("--rows", type=int, default=44, help="tall enough for the benchmark's whole report")
    parser.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    parser.add_argument("--fps", type=float, default=8)
    parser.add_argument("--max-gap", type=float, default=1.5, help="longest pause kept, in seconds")
    parser.add_argument("--font", default=None, help="a monospace .ttf (default: DejaVu Sans Mono)")
    parser.add_argument("--font-size", type=int, default=13)
    args = parser.parse_args(argv)
    cast = args.out.with_suffix(".cast")
    if not args.render_only:
        record_demo(args.cols, args.rows, args.port or free_port()).write_cast(cast)
    count = render_gif(cast, args.out, args.fps, args.max_gap, font_size=args.font_size, font_path=args.font)
    print(f"{cast} -> {args.out}: {count} frames, {args.out.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
