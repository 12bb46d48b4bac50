"""Draft-model proposer: a small model with the target's tokenizer drafts k tokens per step, in the worker.

After each target step it runs a catch-up forward over every token the target computed this step (each
drafting row through its new last token, whose logits give the first draft), then k - 1 one-token steps over
the drafting rows. Its KV layers share the target's block ids (`model_proposer.py`); what it writes past the
scheduler's blocks (its own drafts, the new token when it starts a block) goes to per-slot scratch blocks, and
the next catch-up rewrites those positions in real blocks, so rejected drafts need no rollback of their own.
Greedy rows draft the argmax; sampled rows draw from q = softmax of the logits warped with the request's own
temperature/top-k/top-p/min-p, with noise independent of the target's (a seeded row's is hashed from its seed
salted for drafting, so seeded output stays reproducible).

Usage: --speculative-config '{"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3}'
"""

from __future__ import annotations

import numpy as np
import torch

from rapid_llm.config import ModelConfig
from rapid_llm.distributed import tp_broadcast
from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.sampler import log_exponential_noise, warp_logits
from rapid_llm.layers.sampling_batch import to_int64
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.model_loader import load_model
from rapid_llm.ops.attention import StepLayout
from rapid_llm.spec_decode.model_proposer import Drafts, ModelProposer, ProposerStep, TargetContext
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
from rapid_llm.utils.host_staging import to_device

DRAFT_SALT = to_int64(0x5DEECE66D2B79F5A)  # xor-ed into a seeded row's seed for its draft noise


class DraftModelProposer(ModelProposer):
    catch_up_from_tokens = True

    def __init__(self, config, target: TargetContext) -> None:
        super().__init__(config, target)
        target_config = target.model_config
        self.model_config = ModelConfig.from_pretrained(model_dir_or_demo(config.model), dtype=target_config.dtype_name,
                                                        max_model_len=target_config.max_model_len)
        if self.model_config.vocab_size != target_config.vocab_size:
            raise ValueError(f"--speculative-config: the draft model {config.model!r} has {self.model_config.vocab_size} "
                             f"tokens, the target {target_config.vocab_size}: they must share the tokenizer")
        self.model = load_model(self.model_config, target.device)
        if any(isinstance(module, StateLayer) for module in self.model.modules()):
            raise ValueError(f"--speculative-config: the draft model {config.model!r} "
                             f"({self.model_config.architecture}) keeps recurrent state (linear-attention, Mamba or "
                             "convolution layers); a draft model must be attention-only, since its own drafts would "
                             "need their state rolled back too. A hybrid target takes an attention-only draft, or "
                             "ngram speculation")
        # The positions past a row's scheduler blocks it may write: the new token and k - 1 drafts.
        self.scratch_blocks_per_slot = -(-config.num_speculative_tokens // target.block_size)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    def kv_layers(self) -> list[PagedAttentionLayer]:
        return [module for module in self.model.modules() if isinstance(module, PagedAttentionLayer)]

    @torch.inference_mode()
    def propose(self, step: ProposerStep) -> Drafts:
        device = self.target.device
        lengths = step.query_lens.copy()
        lengths[step.draft_rows] = step.num_tokens - step.starts[step.draft_rows]
        tables, device_table = self._tables(step)
        all_rows = np.arange(step.slots.size)
        hidden = self._forward(step, all_rows, lengths, step.starts + lengths, tables, device_table)
        num_rows, k = step.draft_rows.size, int(step.max_drafts.max(initial=0))
        tokens = torch.full((num_rows, k), -1, dtype=torch.int64, device=device)
        if not num_rows:
            return Drafts(tokens, None, np.zeros(0, dtype=bool))
        slots = step.slots[step.draft_rows]
        last = to_device([torch.from_numpy(np.cumsum(lengths)[step.draft_rows] - 1)], device)[0]
        sampled = ~step.sampling.host_greedy[slots]
        probs = (torch.zeros(num_rows, k, self.model_config.vocab_size, dtype=torch.float32, device=device)
                 if sampled.any() else None)
        logits = self.model.compute_logits(hidden[last])
        active = np.arange(num_rows)
        for position in range(k):
            self._draw(step, logits, active, position, tokens, probs)
            active = active[step.max_drafts[active] > position + 1]
            if not active.size:
                break
            active_on_device = to_device([torch.from_numpy(active)], device)[0]
            hidden = self._forward(step, step.draft_rows[active], np.ones(active.size, dtype=np.int64),
                                   step.num_tokens[active] + position + 1, tables, device_table,
                                   input_ids=tokens[active_on_device, position])
            logits = self.model.compute_logits(hidden)
        return Drafts(tokens, probs, sampled)

    def _tables(self, step: ProposerStep) -> tuple[list[list[int]], torch.Tensor]:
        """Each chunk's block table (a drafting row's with its scratch blocks appended), and all of them as one
        device table per step (padded with the padding block), sliced by row for each forward."""
        drafting = np.zeros(step.slots.size, dtype=bool)
        drafting[step.draft_rows] = True
        tables = [self._table(step, row, drafting[row]) for row in range(step.slots.size)]
        width = max(len(table) for table in tables)
        device_table = to_device([torch.tensor([table + [self.kv.padding_block] * (width - len(table))
                                                for table in tables], dtype=torch.int64)], self.target.device)[0]
        return tables, device_table

    def _table(self, step: ProposerStep, row: int, drafting: bool) -> list[int]:
        table = list(step.block_tables[row])
        if drafting:
            first = self.kv.first_scratch_block + int(step.slots[row]) * self.scratch_blocks_per_slot
            table += range(first, first + self.scratch_blocks_per_slot)
        return table

    def _forward(self, step: ProposerStep, rows: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                 tables: list[list[int]], device_table: torch.Tensor,
                 input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The draft's hidden states of chunk `rows` computing query_lens tokens each (ids from the token pool
        unless given)."""
        return self.model(self._batch(step, rows, query_lens, seq_lens, tables, device_table, input_ids))

    def _batch(self, step: ProposerStep, rows: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
               tables: list[list[int]], device_table: torch.Tensor, input_ids: torch.Tensor | None,
               token_offset: int = 0) -> ForwardBatch:
        """The forward batch of chunk `rows` computing query_lens positions each; unless given, the ids are the
        token pool's at each position + `token_offset` (the MTP proposer reads the next token)."""
        device = self.target.device
        rows_on_device, slots_on_device = to_device([torch.from_numpy(rows), torch.from_numpy(step.slots[rows])],
                                                    device)
        layout = StepLayout(query_lens.tolist(), seq_lens.tolist(), [tables[row] for row in rows.tolist()],
                            self.target.block_size, block_table=device_table[rows_on_device])
        attention = self.target.backend.build_metadata(layout, device)
        if input_ids is None:
            input_ids = step.token_pool[slots_on_device[attention.seq_index], attention.positions + token_offset].long()
        return ForwardBatch(input_ids=input_ids, attention=attention)

    def _draw(self, step: ProposerStep, logits: torch.Tensor, active: np.ndarray, position: int,
              tokens: torch.Tensor, probs: torch.Tensor | None) -> None:
        """Draft `position` of the `active` rows (logits [len(active), V]): argmax, or a draw from q."""
        device = self.target.device
        rows = step.draft_rows[active]
        slots = step.slots[rows]
        slots_on_device, active_on_device = to_device([torch.from_numpy(slots), torch.from_numpy(active)], device)
        batch = step.sampling.batch(slots, slots_on_device, step.num_outputs[active] + position)
        logits = logits.float()
        choice = logits.argmax(dim=-1)
        if not batch.all_greedy:
            warped = warp_logits(logits, batch)
            noise = log_exponential_noise(warped.shape, batch.seeded_rows, batch.seeds ^ DRAFT_SALT, batch.seed_steps,
                                          device)
            choice = torch.where(batch.is_greedy, choice, (warped - noise).argmax(dim=-1))
            probs[active_on_device, position] = warped.softmax(dim=-1)
        # Tensor-parallel ranks feed the next draft step the same tokens (rank 0's draw).
        tokens[active_on_device, position] = tp_broadcast(choice)
