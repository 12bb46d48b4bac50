"""Detokenizer process: incremental text, stop strings, the TokenBatch -> TextBatch mapping, and the process itself."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from tokenizers import Tokenizer, decoders, models, normalizers

from rapid_llm.detokenizer_proc.detokenizer import Detokenizer, load_tokenizer
from rapid_llm.detokenizer_proc.incremental import IncrementalDetokenizer, StopStringMatcher
from rapid_llm.detokenizer_proc.process import run_detokenizer
from rapid_llm.ipc.messages import (
    DetokenizeRequest,
    TextBatch,
    TextDelta,
    TokenBatch,
    TokenLogprobs,
    TokenUpdate,
)
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.utils.tiny_checkpoint import (
    EOS_TOKEN_ID,
    IM_END_TOKEN_ID,
    IM_START_TOKEN_ID,
    VOCAB_SIZE,
    build_tokenizer,
)

PROMPT = "The server reads a request"
SENTENCE = "The capital of France is Paris. The weather today is sunny."
TEXTS = {
    "ascii": "Hello world, this is a test of the server.",
    "accents": "café naïve, ça va? déjà vu",
    "cjk": "日本語 中文 你好世界！",
    "emoji": "hi 😀🎉 ok 👨\u200d👩\u200d👧 bye",
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return load_tokenizer(str(tokenizer_dir))


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def stream(
    detokenizer: Detokenizer,
    output_ids: list[int],
    per_update: int = 1,
    finish_reason: str | None = "length",
) -> list[TextDelta]:
    """Feed `output_ids` in updates of `per_update` tokens, the last one finishing; return every delta."""
    deltas: list[TextDelta] = []
    for start in range(0, len(output_ids), per_update):
        last = start + per_update >= len(output_ids)
        update = TokenUpdate("r", output_ids[start : start + per_update], finish_reason=finish_reason if last else None)
        result = detokenizer.process(TokenBatch(updates=[update]))
        deltas.extend(result.deltas if result is not None else [])
    return deltas


def start_request(
    detokenizer: Detokenizer, tokenizer: Tokenizer, stop: tuple[str, ...] = (), skip_special_tokens: bool = True
) -> None:
    request = DetokenizeRequest("r", encode(tokenizer, PROMPT), list(stop), skip_special_tokens)
    assert detokenizer.process(TokenBatch(new_requests=[request])) is None


def joined(deltas: list[TextDelta]) -> str:
    return "".join(delta.text for delta in deltas)


# ---- incremental decoding --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["accents", "cjk", "emoji"])
def test_sample_texts_split_characters_across_tokens(tokenizer: Tokenizer, name: str) -> None:
    assert any(tokenizer.decode([token_id]) == "\ufffd" for token_id in encode(tokenizer, TEXTS[name]))


@pytest.mark.parametrize("per_update", [1, 3])
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_streamed_deltas_concatenate_to_the_full_decode(tokenizer: Tokenizer, name: str, per_update: int) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer)
    output_ids = encode(tokenizer, TEXTS[name])
    deltas = stream(detokenizer, output_ids, per_update)
    assert joined(deltas) == tokenizer.decode(output_ids) == TEXTS[name]
    assert not any("\ufffd" in delta.text for delta in deltas)
    assert [token_id for delta in deltas for token_id in delta.token_ids] == output_ids
    assert [delta.finish_reason for delta in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert detokenizer.num_requests == 0


def test_random_token_streams_match_the_full_decode(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    for _ in range(300):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(8))]
        output_ids = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(1, 40))]
        skip = rng.random() < 0.5
        detok = IncrementalDetokenizer(tokenizer, prompt, skip)
        text = "".join(detok.add(token_id) for token_id in output_ids) + detok.finish()
        assert text == tokenizer.decode(output_ids, skip_special_tokens=skip)


def test_invalid_bytes_keep_the_window_short(tokenizer: Tokenizer) -> None:
    lead_byte = encode(tokenizer, "日")[0]  # a token that is only the first byte of a 3-byte character
    detok = IncrementalDetokenizer(tokenizer, [])
    text = "".join(detok.add(lead_byte) for _ in range(200)) + detok.finish()
    assert text == "\ufffd" * 200
    assert len(detok._window) < 40


def test_sentencepiece_style_spacing_uses_prompt_context() -> None:
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "▁again": 3}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    assert tokenizer.decode([2, 3]) == "world again"  # alone, the leading space is stripped

    detok = IncrementalDetokenizer(tokenizer, [1])
    assert [detok.add(2), detok.add(3), detok.finish()] == [" world", " again", ""]


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(tokenizer: Tokenizer, skip: bool) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer, skip_special_tokens=skip)
    output_ids = [IM_START_TOKEN_ID, *encode(tokenizer, "hi there"), IM_END_TOKEN_ID, EOS_TOKEN_ID]
    text = joined(stream(detokenizer, output_ids, finish_reason="stop"))
    assert text == ("hi there" if skip else "<|im_start|>hi there<|im_end|><|eos|>")


def test_prompt_text_is_not_in_the_output(tokenizer: Tokenizer) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer)
    assert joined(stream(detokenizer, encode(tokenizer, " to the server"))) == " to the server"


# ---- stop strings ----------------------------------------------------------------------------


def run_with_stops(tokenizer: Tokenizer, stop: list[str], text: str = SENTENCE, per_update: int = 1) -> list[TextDelta]:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer, stop=tuple(stop))
    deltas = stream(detokenizer, encode(tokenizer, text), per_update)
    assert detokenizer.num_requests == 0
    return deltas


@pytest.mark.parametrize(
    ("stop", "expected_text", "matched", "last_token"),
    [
        (["ra"], "The capital of F", "ra", "ran"),  # inside one token
        (["Paris"], "The capital of France is ", "Paris", "is"),  # across three tokens
        (["The"], "", "The", "The"),  # at the very start
        (["weather", "France", "capital"], "The ", "capital", "al"),  # several: the first occurrence wins
    ],
)
@pytest.mark.parametrize("per_update", [1, 4])
def test_stop_strings(
    tokenizer: Tokenizer, stop: list[str], expected_text: str, matched: str, last_token: str, per_update: int
) -> None:
    deltas = run_with_stops(tokenizer, stop, per_update=per_update)
    final = deltas[-1]
    assert joined(deltas) == expected_text
    assert (final.finish_reason, final.stop_reason) == ("stop", matched)
    assert all(delta.finish_reason is None for delta in deltas[:-1])
    token_ids = [token_id for delta in deltas for token_id in delta.token_ids]
    assert tokenizer.decode(token_ids[-1:]) == last_token
    assert token_ids == encode(tokenizer, SENTENCE)[: len(token_ids)]


def test_stop_strings_wait_for_min_tokens(tokenizer: Tokenizer) -> None:
    """As in vLLM: "The" at the very start does not stop a request that must produce 3 tokens first."""
    output_ids = encode(tokenizer, "The cat saw The end")
    for min_tokens, expected in ((0, ""), (3, "The cat saw ")):
        detokenizer = Detokenizer(tokenizer)
        request = DetokenizeRequest("r", encode(tokenizer, PROMPT), ["The"], min_tokens=min_tokens)
        detokenizer.process(TokenBatch(new_requests=[request]))
        deltas = stream(detokenizer, output_ids)
        assert joined(deltas) == expected
        assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", "The")


@pytest.mark.parametrize(("stop", "expected_text"), [
    (["ra"], "The capital of Fra"),  # inside one token: the rest of "ran" is still cut
    (["Paris"], "The capital of France is Paris"),  # across three tokens
    (["The"], "The"),
])
@pytest.mark.parametrize("per_update", [1, 4])
def test_include_stop_str_in_output_keeps_the_matched_stop_string(
    tokenizer: Tokenizer, stop: list[str], expected_text: str, per_update: int
) -> None:
    detokenizer = Detokenizer(tokenizer)
    request = DetokenizeRequest("r", encode(tokenizer, PROMPT), stop, include_stop_str_in_output=True)
    detokenizer.process(TokenBatch(new_requests=[request]))
    deltas = stream(detokenizer, encode(tokenizer, SENTENCE), per_update)
    assert joined(deltas) == expected_text
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", stop[0])


def test_updates_after_a_stop_string_are_ignored(tokenizer: Tokenizer) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer, stop=("Paris",))
    deltas = stream(detokenizer, encode(tokenizer, "It is Paris"), finish_reason=None)
    assert deltas[-1].finish_reason == "stop"
    more = TokenUpdate("r", encode(tokenizer, " again"))
    assert detokenizer.process(TokenBatch(updates=[more])) is None
    abort = TokenUpdate("r", [], finish_reason="abort")
    assert detokenizer.process(TokenBatch(updates=[abort])) is None
    # The scheduler's end of the request forgets it: a later update is then an unknown request's.
    assert detokenizer.process(TokenBatch(updates=[abort])) is not None


def test_stop_string_mid_update_cuts_token_ids_and_logprobs(tokenizer: Tokenizer) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer, stop=("ran",))
    token_ids = encode(tokenizer, " of France is")
    logprobs = [TokenLogprobs(logprob=-float(i)) for i in range(len(token_ids))]
    stop_index = [tokenizer.decode([t]) for t in token_ids].index("ran")
    assert stop_index < len(token_ids) - 1

    update = TokenUpdate("r", token_ids, logprobs, num_prompt_tokens=7, num_cached_tokens=3, queue_time=0.25,
                         prefill_time=0.5)
    result = detokenizer.process(TokenBatch(updates=[update]))
    assert result is not None
    (delta,) = result.deltas
    assert delta.text == " of F"
    assert delta.token_ids == token_ids[: stop_index + 1]
    assert delta.logprobs == logprobs[: stop_index + 1]
    assert (delta.finish_reason, delta.stop_reason) == ("stop", "ran")
    assert (delta.num_prompt_tokens, delta.num_cached_tokens) == (7, 3)
    assert (delta.queue_time, delta.prefill_time) == (0.25, 0.5)


def test_possible_stop_prefix_is_held_back_then_released(tokenizer: Tokenizer) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer, stop=("Paris!",))
    deltas = stream(detokenizer, encode(tokenizer, "is Paris"), finish_reason=None)
    assert joined(deltas) == "is "  # "Paris" could still become "Paris!"
    assert deltas[-1].token_ids  # the tokens are reported even though their text is held
    deltas = stream(detokenizer, encode(tokenizer, "."), finish_reason=None)
    assert joined(deltas) == "Paris."


def test_held_back_text_is_released_on_length_finish(tokenizer: Tokenizer) -> None:
    deltas = run_with_stops(tokenizer, ["Parisian"], text="is Paris")
    assert "Paris" not in joined(deltas[:-1])
    assert deltas[-1].text.endswith("Paris")
    assert joined(deltas) == "is Paris"
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("length", None)


def test_stop_match_prefers_the_earliest_completed_string() -> None:
    whole = StopStringMatcher(["abcd", "bc"])
    assert whole.feed("xabcd") == ("xa", "bc")
    by_char = StopStringMatcher(["abcd", "bc"])
    assert [by_char.feed(c) for c in "xabc"][-1] == ("a", "bc")
    assert StopStringMatcher(["b", "ab"]).feed("xab") == ("x", "ab")
    assert StopStringMatcher(["", "b"]).feed("ab") == ("a", "b")


# ---- requests the detokenizer has not seen, empty updates --------------------------------------


def test_abort_of_an_unknown_request_still_produces_a_delta(tokenizer: Tokenizer) -> None:
    result = Detokenizer(tokenizer).process(TokenBatch(updates=[TokenUpdate("ghost", [], finish_reason="abort")]))
    assert result == TextBatch([TextDelta("ghost", "", [], finish_reason="abort")])


def test_an_update_with_nothing_in_it_produces_no_delta(tokenizer: Tokenizer) -> None:
    detokenizer = Detokenizer(tokenizer)
    start_request(detokenizer, tokenizer)
    assert detokenizer.process(TokenBatch(updates=[TokenUpdate("r", [])])) is None
    assert detokenizer.num_requests == 1


# ---- loading and the process -----------------------------------------------------------------


def test_loading_does_not_import_torch(tokenizer_dir: Path) -> None:
    code = (
        "import sys\n"
        "from rapid_llm.detokenizer_proc.process import run_detokenizer\n"
        "from rapid_llm.detokenizer_proc.detokenizer import load_tokenizer\n"
        f"load_tokenizer({str(tokenizer_dir)!r})\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_fallback_without_tokenizer_json(tokenizer: Tokenizer, tokenizer_dir: Path, tmp_path: Path) -> None:
    bpe = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]
    (tmp_path / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    merges = "\n".join(" ".join(pair) for pair in bpe["merges"])
    (tmp_path / "merges.txt").write_text(f"#version: 0.2\n{merges}\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    output_ids = encode(tokenizer, TEXTS["cjk"])
    assert load_tokenizer(str(tmp_path)).decode(output_ids) == TEXTS["cjk"]


def test_process_round_trip_and_clean_sigterm(
    tokenizer: Tokenizer, tokenizer_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    paths = IpcPaths.create(1)
    context = zmq.Context()
    spawn = multiprocessing.get_context("spawn")
    process = None
    try:
        frontend: Receiver[TextBatch] = Receiver(context, paths.detokenizer_to_frontend, TextBatch)
        ready_recv, ready_send = spawn.Pipe(duplex=False)
        process = spawn.Process(target=run_detokenizer, args=(str(tokenizer_dir), paths, "info", ready_send), daemon=True)
        process.start()
        ready_send.close()
        assert ready_recv.poll(60)
        assert ready_recv.recv()[0] == "ready"

        output_ids = encode(tokenizer, TEXTS["emoji"])
        batch = TokenBatch(
            new_requests=[DetokenizeRequest("r", encode(tokenizer, PROMPT))],
            updates=[TokenUpdate("r", output_ids, finish_reason="length", num_prompt_tokens=5)],
        )
        # Kept in a variable: a collected socket closes with LINGER=0 and drops what it has not sent.
        scheduler = Sender(context, paths.scheduler_to_detokenizer)
        scheduler.send(batch)
        assert frontend.socket.poll(30_000)
        expected = TextDelta("r", TEXTS["emoji"], output_ids, finish_reason="length", num_prompt_tokens=5)
        assert frontend.recv() == TextBatch([expected])

        process.terminate()
        process.join(30)
        assert process.exitcode == 0
        assert "Traceback" not in capfd.readouterr().err
    finally:
        if process is not None and process.is_alive():
            process.kill()
        context.destroy(linger=0)
        paths.remove()
    assert not os.path.exists(paths.directory)


def test_process_reports_start_up_errors(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("not json")
    paths = IpcPaths.create(1)
    spawn = multiprocessing.get_context("spawn")
    try:
        ready_recv, ready_send = spawn.Pipe(duplex=False)
        process = spawn.Process(target=run_detokenizer, args=(str(tmp_path), paths, "info", ready_send), daemon=True)
        process.start()
        ready_send.close()
        assert ready_recv.poll(60)
        status, message = ready_recv.recv()
        process.join(30)
    finally:
        paths.remove()
    assert status == "error"
    assert message.splitlines()[0].startswith("Exception: ")
    assert "Traceback" in message
    assert process.exitcode == 1
