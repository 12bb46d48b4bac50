"""JSON schemas, regexes and choices for the structured-output tests, each with a finite language.

A random tiny model never ends a free-form string or array by itself, and xgrammar allows EOS only
once the grammar is complete, so a length finish would truncate the JSON. Every string here has a
maxLength / pattern / enum, every array a maxItems and every number bounds (xgrammar bounds a number's
fraction digits too), so each output is at most a few hundred characters: MAX_TOKENS (each token at
least one character) always reaches the end.
"""

from __future__ import annotations

SMALL_INT = {"type": "integer", "minimum": -5, "maximum": 5}
SCHEMAS: dict[str, dict] = {
    "flat_required": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                       "kind": {"enum": ["a", "bb", "ccc"]}},
                      "required": ["id", "kind"]},
    "nested_objects": {"type": "object", "required": ["user", "active"], "properties": {
        "user": {"type": "object", "required": ["id", "name"], "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 50}, "name": {"type": "string", "maxLength": 6}}},
        "active": {"type": "boolean"}}},
    "array_of_enums": {"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}}},
    "array_of_objects": {"type": "object", "required": ["pairs"], "properties": {
        "pairs": {"type": "array", "maxItems": 2, "items": {
            "type": "object", "required": ["k", "v"],
            "properties": {"k": {"enum": ["x", "y"]}, "v": SMALL_INT}}}}},
    "optional_properties": {"type": "object", "required": ["a"], "properties": {
        "a": SMALL_INT, "b": {"type": "boolean"}, "c": {"type": "string", "maxLength": 3}}},
    "number_bounds": {"type": "object", "required": ["p", "t"], "properties": {
        "p": {"type": "number", "minimum": 0, "maximum": 1},
        "t": {"type": "number", "minimum": -40.5, "maximum": 60}}},
    "exclusive_bounds": {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5}}},
    "mixed_enum_const": {"type": "object", "required": ["e", "version"], "properties": {
        "e": {"enum": [1, "two", None, True]}, "version": {"const": "v1"}}},
    "pattern_string": {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}},
    "any_of": {"type": "object", "required": ["value"], "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]}}},
    "nested_arrays": {"type": "object", "required": ["grid"], "properties": {
        "grid": {"type": "array", "minItems": 1, "maxItems": 2,
                 "items": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 1}}}}},
    "null_and_bool": {"type": "object", "required": ["flag", "nothing"], "properties": {
        "flag": {"type": "boolean"}, "nothing": {"type": "null"}}},
}
REGEXES = [r"[a-c]{2,5}\d", r"(yes|no)-[0-9]{1,3}", r"[A-Z][a-z]{0,4}@(x|yz)\.com"]
CHOICES = [["positive", "negative", "neutral"], ["a", "ab", "abc"]]
MAX_TOKENS = 300
