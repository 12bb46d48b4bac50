"""Convert one of this project's random benchmark checkpoints to GGUF for the llama.cpp peer.

    python benchmarks/peers/convert_to_gguf.py LLAMA_CPP_SRC HF_DIR OUT.gguf

Runs llama.cpp's own converter (`convert_hf_to_gguf.py`, vendored in the llama-cpp-python sdist that
setup_llama_cpp.sh unpacks) on HF_DIR, in bf16 like the served checkpoint. One thing is set first: the
checkpoints carry the project's tiny byte-level BPE tokenizer (tiny_checkpoint.py), whose pre-tokenizer
hash llama.cpp does not list, and whose Llama config would send the converter to SentencePiece; its
pre-tokenizer is the GPT-2 byte-level split, so the vocabulary is written as GPT-2's ("gpt2" model, "gpt-2"
pre-tokenizer), which makes llama.cpp tokenize text into the same ids as the HF tokenizer.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    source, model_dir, out_file = Path(argv[0]), argv[1], argv[2]
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{source}: no convert_hf_to_gguf.py (run benchmarks/peers/setup_llama_cpp.sh)")
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import convert_hf_to_gguf  # from the llama.cpp tree just put on the path
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    model_class_of = convert_hf_to_gguf.get_model_class

    def gpt2_vocabulary_class(name: str, mmproj: bool = False) -> type:
        model_class = model_class_of(name, mmproj)  # imported on demand, so patched once chosen
        model_class.set_vocab = TextModel._set_vocab_gpt2
        return model_class

    convert_hf_to_gguf.get_model_class = gpt2_vocabulary_class
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "bf16", "--outfile", out_file]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1:])
