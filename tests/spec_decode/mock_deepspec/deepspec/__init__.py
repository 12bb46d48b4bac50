"""Stand-in for DeepSeek's DeepSpec 0.1.0 with the DSpark entry points rapid_llm's adapter calls
(docs/spec_decode/dspark.md): `modeling.dspark.qwen3.Qwen3DSparkModel` and `eval.dspark.draft_ops`'
`forward_dspark_draft_block` / `build_dspark_proposal`, with the keyword arguments DeepSpec's evaluator passes."""

__version__ = "0.1.0"
