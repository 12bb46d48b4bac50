"""Multi-LoRA serving: PEFT adapter folders read and checked (`adapter_files`), linears that add each token's
adapter (`lora_linear`), and the worker's adapter slots with their host tier (`adapter_slots`). See docs/lora.md."""
