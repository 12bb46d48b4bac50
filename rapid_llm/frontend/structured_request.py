"""The request fields that constrain the output, read into one `StructuredOutputsParams`, and their checks.

Accepted, on both generation routes: OpenAI's `response_format` (`text`, `json_object`, `json_schema`
with `json_schema.schema` and `strict`), vLLM's `structured_outputs` object (json / json_object / regex /
choice / grammar) and its legacy `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. At most
one of them may constrain a request. `check_structured_outputs` parses the grammar with xgrammar (in a
worker thread: a large schema takes milliseconds), so a spec the library rejects is a 400 naming the
field and xgrammar's reason rather than a failure in the engine.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from rapid_llm.frontend.errors import bad_request
from rapid_llm.sampling.params import StructuredOutputsParams
from rapid_llm.structured.grammar_spec import GrammarSpec, GrammarSpecError


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str | None = None
    description: str | None = None
    # A JSON schema; absent means any JSON object. `schema` is the OpenAI name (vLLM also reads `json_schema`).
    schema: dict[str, Any] | None = None
    # Outputs always follow the schema strictly (xgrammar's strict mode), so strict=false only loosens the promise.
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(msgspec.Struct, kw_only=True):
    """vLLM's `structured_outputs` request object (the kinds rapid_llm implements)."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


def structured_outputs_of(response_format: ResponseFormat | None, structured: StructuredOutputsRequest | None,
                          guided: dict[str, Any]) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's constraint and the field it came from; `guided` maps each guided_* name to its value."""
    sources: list[tuple[str, StructuredOutputsParams]] = []
    if response_format is not None and response_format.type != "text":
        sources.append(_from_response_format(response_format))
    if structured is not None:
        sources.append(("structured_outputs", _params(structured.json, "structured_outputs.json",
                                                      bool(structured.json_object), structured.regex,
                                                      structured.choice, structured.grammar)))
    guided_set = {name: value for name, value in guided.items() if value is not None}
    if guided_set:
        sources.append((next(iter(guided_set)), _params(
            guided.get("guided_json"), "guided_json", False, guided.get("guided_regex"),
            guided.get("guided_choice"), guided.get("guided_grammar"))))
    fields = [field for source, params in sources for field in _fields(source, params, guided_set)]
    if len(fields) > 1:
        raise bad_request(f"only one structured output may be set per request, got {', '.join(fields)}",
                          param=fields[1])
    if not sources:
        return None, None
    field, params = sources[0]
    if not params.kinds():
        raise bad_request(f"{field} sets no constraint (json, json_object, regex, choice or grammar)", param=field)
    return params, fields[0]


def check_structured_outputs(params: StructuredOutputsParams, field: str) -> None:
    """Raise a 400 naming `field` when xgrammar cannot parse the constraint."""
    try:
        GrammarSpec.of(params).check()
    except GrammarSpecError as error:
        raise bad_request(f"{field} is not a valid {params.kinds()[0]} for structured output: {error}",
                          param=field) from None


def _from_response_format(response_format: ResponseFormat) -> tuple[str, StructuredOutputsParams]:
    if response_format.type == "json_object":
        return "response_format", StructuredOutputsParams(json_object=True)
    if response_format.json_schema is None:
        raise bad_request("response_format of type json_schema needs a json_schema object",
                          param="response_format.json_schema")
    schema = response_format.json_schema.schema
    if schema is None:
        return "response_format", StructuredOutputsParams(json_object=True)
    return "response_format.json_schema.schema", StructuredOutputsParams(json=json.dumps(schema))


def _params(schema: dict[str, Any] | str | None, schema_field: str, json_object: bool, regex: str | None,
            choice: list[str] | None, grammar: str | None) -> StructuredOutputsParams:
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as error:
            raise bad_request(f"{schema_field} is not valid JSON: {error}", param=schema_field) from None
    elif schema is not None:
        schema = json.dumps(schema)
    return StructuredOutputsParams(json=schema, json_object=json_object, regex=regex, choice=choice, grammar=grammar)


def _fields(source: str, params: StructuredOutputsParams, guided_set: dict[str, Any]) -> list[str]:
    """The request field names behind one source, for naming what conflicts."""
    if source == "structured_outputs":
        return [f"structured_outputs.{kind}" for kind in params.kinds()]
    if source in guided_set:
        return list(guided_set)
    return [source]
