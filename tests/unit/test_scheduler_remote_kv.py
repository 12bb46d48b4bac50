"""Prefill/decode disaggregation in the scheduler (scheduler_proc/remote_kv.py and the remote step policies), with
two schedulers driven by test_scheduler.py's fake worker and a fake transfer agent that copies the simulated KV
of a producer's leased blocks into a consumer's blocks: a prompt prefilled on one decodes on the other from the
copied blocks as prefix hits with the reference tokens; a load waits for the steps planned before its blocks were
taken; staged requests never hold up admission; failures, a foreign prompt and aborts fall back or free, and both
sides end with no block in use."""

from __future__ import annotations

from collections import deque

import msgspec
import pytest

from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.ipc.messages import GenerateRequest, KVLease, KVLoad, KVTransferEnded, StepPlan
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.kv_transfer_params import KVTransferParams
from rapid_llm.scheduler_proc.admission import RequestRejected
from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import FakeWorker, hashed_model, make_config, reference
from tests.unit.test_scheduler_prefix_cache import first_chunk, run_until_idle

PROMPT = list(range(1, 19))  # 18 tokens in 4-token blocks: 4 full blocks leased ((18 - 1) // 4)
PRODUCER = KVTransferConfig(kv_role="kv_producer", kv_port=5999)
CONSUMER = KVTransferConfig(kv_role="kv_consumer")


class Side:
    """A scheduler, its fake worker, and what its agent was told."""

    def __init__(self, kv_transfer: KVTransferConfig | None, **config: object) -> None:
        self.config = make_config(kv_transfer=kv_transfer, **config)
        self.scheduler = Scheduler(self.config)
        self.worker = FakeWorker(self.config, hashed_model)
        self.commands: list[KVLease | KVLoad] = []

    def exchange(self, events: list[KVTransferEnded] = ()) -> list[KVLease | KVLoad]:
        new = self.scheduler.exchange_kv(events)
        self.commands += new
        return new

    def run(self, depth: int = 1) -> list[StepPlan]:
        self.exchange()
        return run_until_idle(self.scheduler, self.worker, depth)

    def outputs(self) -> dict[str, list]:
        batch = self.scheduler.take_outputs()
        return {} if batch is None else {update.request_id: update for update in batch.updates}

    def blocks_used(self) -> int:
        return self.scheduler.stats().kv_blocks_used


def generate(request_id: str, prompt: list[int], kv: KVTransferParams, **params: object) -> GenerateRequest:
    return GenerateRequest(request_id, prompt, SamplingParams(kv_transfer_params=kv, **params))


def prefill(producer: Side, prompt: list[int] = PROMPT) -> KVTransferParams:
    producer.scheduler.add_request(generate("p", prompt, KVTransferParams(do_remote_decode=True), max_tokens=1,
                                            ignore_eos=True))
    producer.run()
    producer.exchange()
    params = producer.outputs()["p"].kv_transfer_params
    assert params is not None and params.do_remote_prefill
    return params


def copy_kv(producer: Side, consumer: Side, load: KVLoad) -> None:
    """The agents' transfer: the leased blocks' simulated KV from the producer's cache into the consumer's."""
    lease = next(c for c in producer.commands if isinstance(c, KVLease) and c.transfer_id == load.transfer_id)
    for src, dst in zip(lease.block_ids[load.first_block:], load.block_ids, strict=True):
        consumer.worker.kv[dst] = list(producer.worker.kv[src])


def loads(commands: list) -> list[KVLoad]:
    return [command for command in commands if isinstance(command, KVLoad)]


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_a_prompt_prefilled_on_one_scheduler_decodes_on_the_other_from_its_blocks(depth: int) -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    lease = producer.commands[-1]
    assert isinstance(lease, KVLease) and len(lease.block_ids) == 4 and params.remote_block_ids == lease.block_ids
    assert producer.blocks_used() == 4  # the lease holds the prompt's full blocks, the rest went back

    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=6, ignore_eos=True))
    (load,) = consumer.exchange()
    assert (load.first_block, len(load.block_ids), load.address) == (0, 4, "tcp://127.0.0.1:5999")
    assert consumer.scheduler.stats().num_waiting == 1 and consumer.scheduler.schedule() is None
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    chunk = first_chunk(consumer.run(depth), "d")
    assert (chunk.cached_block_ids, chunk.num_computed_tokens, chunk.num_new_tokens) == (load.block_ids, 16, 2)
    expected = reference(GenerateRequest("d", PROMPT, SamplingParams(max_tokens=6, ignore_eos=True)),
                         consumer.config, hashed_model)
    assert consumer.outputs()["d"].token_ids == expected.token_ids
    producer.exchange([KVTransferEnded(load.transfer_id, "done")])
    assert producer.blocks_used() == 0 and consumer.blocks_used() == 0
    assert not producer.scheduler.has_unfinished_requests() and not consumer.scheduler.has_unfinished_requests()


def test_a_load_waits_for_the_steps_planned_before_its_blocks_were_taken() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("busy", [7, 8, 9], None, max_tokens=20, ignore_eos=True))
    sent = deque([consumer.scheduler.schedule(), consumer.scheduler.schedule()])  # two steps in flight
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=2, ignore_eos=True))
    assert consumer.exchange() == []  # blocks taken, but steps planned before may still write them
    consumer.scheduler.process_result(consumer.worker.execute(sent.popleft()))
    assert consumer.exchange() == []
    consumer.scheduler.process_result(consumer.worker.execute(sent.popleft()))
    assert len(loads(consumer.exchange())) == 1


def test_staged_requests_never_hold_up_admission() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=2, ignore_eos=True))
    consumer.scheduler.add_request(generate("local", [5, 6, 7], None, max_tokens=2, ignore_eos=True))
    consumer.run()
    assert consumer.worker.admissions == ["local"]


def test_a_failed_load_prefills_locally_and_frees_its_blocks() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=3, ignore_eos=True))
    (load,) = consumer.exchange()
    consumer.exchange([KVTransferEnded(load.transfer_id, "failed", "no answer before the deadline")])
    chunk = first_chunk(consumer.run(), "d")
    assert (chunk.cached_block_ids, chunk.num_computed_tokens) == ([], 0)
    expected = reference(GenerateRequest("d", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True)),
                         consumer.config, hashed_model)
    assert consumer.outputs()["d"].token_ids == expected.token_ids and consumer.blocks_used() == 0
    producer.exchange([KVTransferEnded(load.transfer_id, "expired")])
    assert producer.blocks_used() == 0


def test_an_abort_while_loading_frees_the_blocks_when_the_load_ends() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=3, ignore_eos=True))
    (load,) = consumer.exchange()
    consumer.scheduler.abort_request("d")
    assert consumer.outputs()["d"].finish_reason == "abort"
    assert consumer.blocks_used() == 4  # the agent may still be writing them
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    assert consumer.blocks_used() == 0 and not consumer.scheduler.has_unfinished_requests()


def test_an_abort_before_the_load_is_sent_releases_the_lease() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("busy", [7, 8, 9], None, max_tokens=20, ignore_eos=True))
    consumer.scheduler.schedule()
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=2, ignore_eos=True))
    assert consumer.exchange() == []
    consumer.scheduler.abort_request("d")
    (release,) = consumer.exchange()
    assert (release.transfer_id, release.block_ids) == (params.transfer_id, [])
    consumer.scheduler.abort_request("busy")
    assert consumer.blocks_used() == 0


def test_another_prompt_is_not_loaded_and_prefills_locally() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    other = [99, *PROMPT[1:]]
    consumer.scheduler.add_request(generate("d", other, params, max_tokens=2, ignore_eos=True))
    (release,) = consumer.exchange()
    assert release.block_ids == []
    chunk = first_chunk(consumer.run(), "d")
    assert chunk.num_computed_tokens == 0 and consumer.blocks_used() == 0


def test_choices_of_one_prompt_share_one_load() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    for index in range(3):
        consumer.scheduler.add_request(generate(f"d-{index}", PROMPT, params, max_tokens=2, ignore_eos=True))
    (load,) = consumer.exchange()
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    plans = consumer.run()
    assert all(first_chunk(plans, f"d-{index}").cached_block_ids == load.block_ids for index in range(3))
    assert consumer.blocks_used() == 0


def test_blocks_cached_on_the_consumer_are_kept_and_only_the_rest_is_loaded() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("warm", PROMPT[:9], None, max_tokens=1, ignore_eos=True))
    consumer.run()  # caches the first two blocks
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=3, ignore_eos=True))
    (load,) = consumer.exchange()
    assert (load.first_block, len(load.block_ids)) == (2, 2)
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    chunk = first_chunk(consumer.run(), "d")
    assert chunk.num_computed_tokens == 16 and chunk.cached_block_ids[2:] == load.block_ids


def test_only_a_prompt_that_ended_by_length_is_leased_and_an_expired_lease_frees_its_blocks() -> None:
    producer = Side(PRODUCER, eos_token_ids=(hashed_model(PROMPT),))  # the first token is EOS: nothing to decode
    producer.scheduler.add_request(generate("stop", PROMPT, KVTransferParams(do_remote_decode=True), max_tokens=1))
    producer.run()
    assert producer.exchange() == [] and producer.outputs()["stop"].kv_transfer_params is None
    producer = Side(PRODUCER)
    params = prefill(producer)
    assert producer.scheduler.has_unfinished_requests()  # a lease holds blocks: no flush yet
    producer.exchange([KVTransferEnded(params.transfer_id, "expired")])
    assert producer.blocks_used() == 0 and producer.scheduler.reset_prefix_cache()


def test_a_request_for_a_role_the_instance_lacks_is_refused() -> None:
    plain = Scheduler(make_config())
    with pytest.raises(RequestRejected, match="kv_producer instance; this one was started without"):
        plain.add_request(generate("p", PROMPT, KVTransferParams(do_remote_decode=True), max_tokens=1))
    producer = Side(PRODUCER)
    params = msgspec.structs.replace(prefill(producer))
    with pytest.raises(RequestRejected, match="kv_consumer instance; this one was started kv_producer"):
        producer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=1))


@pytest.mark.parametrize("second", ["loaded", "failed"])
def test_a_tensor_parallel_load_ends_when_every_rank_has_reported(second: str) -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER, num_worker_ranks=2)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("d", PROMPT, params, max_tokens=2, ignore_eos=True))
    (load,) = consumer.exchange()
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded", num_bytes=10)])
    assert consumer.scheduler.schedule() is None and consumer.blocks_used() == 4  # one rank may still be writing
    consumer.exchange([KVTransferEnded(load.transfer_id, second, "rank 1 timed out", num_bytes=10)])
    chunk = first_chunk(consumer.run(), "d")
    assert chunk.num_computed_tokens == (16 if second == "loaded" else 0)
    stats = consumer.scheduler.stats()
    assert (stats.kv_transfer_loads, stats.kv_transfer_failures, stats.kv_transfer_bytes) == (
        (1, 0, 20) if second == "loaded" else (0, 1, 0))
    assert consumer.blocks_used() == 0


def test_loads_leave_free_blocks_so_loaded_and_queued_requests_always_move_on() -> None:
    producer = Side(PRODUCER)
    consumer = Side(CONSUMER, num_kv_blocks=9, max_model_len=32, max_num_batched_tokens=8)  # 2 blocks kept free
    first = prefill(producer)
    other = list(range(21, 39))
    producer.scheduler.add_request(generate("p2", other, KVTransferParams(do_remote_decode=True), max_tokens=1,
                                            ignore_eos=True))
    producer.run()
    producer.exchange()
    second = producer.outputs()["p2"].kv_transfer_params
    consumer.scheduler.add_request(generate("a", PROMPT, first, max_tokens=4, ignore_eos=True))
    consumer.scheduler.add_request(generate("b", other, second, max_tokens=4, ignore_eos=True))
    (load,) = loads(consumer.exchange())  # the second would leave fewer than 2 free blocks: it waits
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    consumer.run()
    (later,) = loads(consumer.exchange())
    copy_kv(producer, consumer, later)
    consumer.exchange([KVTransferEnded(later.transfer_id, "loaded")])
    consumer.run()
    assert set(consumer.outputs()) == {"a", "b"} and consumer.blocks_used() == 0


def test_a_retry_under_a_pinned_transfer_id_and_an_abort_leave_no_pin_behind() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    consumer.scheduler.add_request(generate("a", PROMPT, params, max_tokens=4, ignore_eos=True))
    (load,) = consumer.exchange()
    copy_kv(producer, consumer, load)
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])  # a waits, its blocks pinned
    consumer.scheduler.add_request(generate("a2", PROMPT, params, max_tokens=4, ignore_eos=True))
    consumer.scheduler.abort_request("a")
    consumer.run()
    assert consumer.blocks_used() == 0 and not consumer.scheduler.has_unfinished_requests()


def test_a_request_of_another_prompt_never_shares_a_load_nor_its_cached_blocks() -> None:
    producer, consumer = Side(PRODUCER), Side(CONSUMER)
    params = prefill(producer)
    other = list(range(40, 58))
    consumer.scheduler.add_request(generate("a", PROMPT, params, max_tokens=4, ignore_eos=True))
    consumer.scheduler.add_request(generate("b", other, params, max_tokens=4, ignore_eos=True))  # refused the load
    (load,) = loads(consumer.exchange())
    copy_kv(producer, consumer, load)
    consumer.scheduler.abort_request("a")  # the load's only request leaves while it is read
    consumer.exchange([KVTransferEnded(load.transfer_id, "loaded")])
    consumer.run()
    consumer.outputs()
    consumer.scheduler.add_request(generate("c", other, None, max_tokens=4, ignore_eos=True))
    consumer.run()  # the fake worker asserts that a hit holds the tokens it was registered for
    expected = reference(GenerateRequest("c", other, SamplingParams(max_tokens=4, ignore_eos=True)),
                         consumer.config, hashed_model)
    assert consumer.outputs()["c"].token_ids == expected.token_ids and consumer.blocks_used() == 0


def test_a_load_that_could_never_fit_beside_the_reserve_prefills_locally_at_once() -> None:
    producer = Side(PRODUCER)
    consumer = Side(CONSUMER, num_kv_blocks=7, max_model_len=28, max_num_batched_tokens=32)  # 3 blocks kept free
    prompt = list(range(1, 27))  # 6 full blocks leased: 6 + 3 > 7
    params = prefill(producer, prompt)
    consumer.scheduler.add_request(generate("d", prompt, params, max_tokens=2, ignore_eos=True))
    (release,) = consumer.exchange()  # at once, not after load_timeout_s
    assert release.block_ids == [] and consumer.scheduler.stats().num_waiting == 1
    assert first_chunk(consumer.run(), "d").num_computed_tokens == 0
