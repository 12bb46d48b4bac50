"""GrammarCompilerPool: compiles grammars on background threads, with a cache of compiles keyed by spec.

Key design choice: the worker's step loop never compiles. `submit(spec)` returns a future at once;
the pool's threads build the tokenizer vocabulary (once, on the first structured request, so servers
that never see one never load it) and then compile, while the step loop keeps running other requests.
Compiles are cached by `GrammarSpec` (kind, text), least recently used out first, so n > 1 choices and
repeated schemas share one compile, finished or still running.
Usage: `pool = GrammarCompilerPool(tokenizer_dir, vocab_size, eos_ids); grammar = pool.submit(spec).result()`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from rapid_llm.structured.grammar_spec import GrammarSpec
from rapid_llm.structured.tokenizer_info import build_tokenizer_info

if TYPE_CHECKING:
    import xgrammar

CACHE_SIZE = 512  # compiled grammars kept (a JSON schema's is tens of KB)
COMPILE_THREADS = 2  # concurrent compiles; each may also use xgrammar's own threads


class GrammarCompilerPool:
    def __init__(self, tokenizer_dir: str, vocab_size: int, eos_token_ids: Sequence[int],
                 trust_remote_code: bool = False, cache_size: int = CACHE_SIZE) -> None:
        self.tokenizer_dir, self.vocab_size = tokenizer_dir, vocab_size
        self.eos_token_ids, self.trust_remote_code = tuple(eos_token_ids), trust_remote_code
        self.cache_size = cache_size
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._compiler: Future[xgrammar.GrammarCompiler] | None = None
        self._cache: OrderedDict[GrammarSpec, Future[xgrammar.CompiledGrammar]] = OrderedDict()

    def submit(self, spec: GrammarSpec) -> Future[xgrammar.CompiledGrammar]:
        """The compile of `spec`, started now unless cached; called from the worker's thread only."""
        cached = self._cache.get(spec)
        if cached is not None:
            self._cache.move_to_end(spec)
            return cached
        if self._compiler is None:
            # Queued first, so a compile thread waiting on it never blocks the one building it.
            self._compiler = self._executor.submit(self._build_compiler)
        future = self._executor.submit(self._compile, self._compiler, spec)
        self._cache[spec] = future
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return future

    def _build_compiler(self) -> xgrammar.GrammarCompiler:
        import xgrammar

        info = build_tokenizer_info(self.tokenizer_dir, self.vocab_size, self.eos_token_ids, self.trust_remote_code)
        return xgrammar.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1))

    @staticmethod
    def _compile(compiler: Future[xgrammar.GrammarCompiler], spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        return spec.compile(compiler.result())
