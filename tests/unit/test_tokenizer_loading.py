"""load_tokenizer (no torch) builds the same tokenizer as AutoTokenizer: encodings and chat prompts."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rapid_llm.utils.demo_checkpoint import DEFAULT_DEMO, demo_model_dir
from rapid_llm.utils.tokenizer_loading import load_tokenizer

TEXTS = ("The server reads a request and", " café naïve 🙂\n\tdef f(x):\n    return x  ", "<|im_start|>user hi", "")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, café?"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again 🙂"}]


@pytest.fixture(params=["tiny", "demo"])
def tokenizer_dir(request, tiny_checkpoint) -> str:
    return str(tiny_checkpoint() if request.param == "tiny" else demo_model_dir(DEFAULT_DEMO))


def test_load_tokenizer_matches_auto_tokenizer(tokenizer_dir: str) -> None:
    ours, auto = load_tokenizer(tokenizer_dir), AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in TEXTS:
        assert ours(text).input_ids == auto(text).input_ids
        assert ours.encode(text, add_special_tokens=False) == auto.encode(text, add_special_tokens=False)
    for add_generation_prompt in (True, False):
        kwargs = {"add_generation_prompt": add_generation_prompt}
        assert ours.apply_chat_template(MESSAGES, tokenize=False, **kwargs) == \
            auto.apply_chat_template(MESSAGES, tokenize=False, **kwargs)
        assert ours.apply_chat_template(MESSAGES, **kwargs) == auto.apply_chat_template(MESSAGES, **kwargs)
    assert (ours.eos_token_id, ours.bos_token_id, ours.all_special_ids, len(ours)) == \
        (auto.eos_token_id, auto.bos_token_id, auto.all_special_ids, len(auto))
    assert ours.decode(ours.encode(TEXTS[1])) == auto.decode(auto.encode(TEXTS[1]))
