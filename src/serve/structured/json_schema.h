// JSON Schema → GBNF: the subset of JSON Schema (2020-12, with draft-07's `definitions`,
// tuple `items` and `additionalItems`, and draft-04's boolean exclusive bounds) that
// GbnfBuilder::add_schema and json_schema_to_gbnf (gbnf_builder.h) compile into a grammar whose
// language is exactly the JSON texts valid for the schema — or, where stated, a documented
// subset of them (never a superset; oneOf is the one exception, below).
//
// Supported keywords, per subschema (paths in errors are JSON pointers: '#/properties/age'):
// - type: a name or an array of names ("null", "boolean", "integer", "number", "string",
//   "array", "object"); each type takes the keywords that apply to it. Without `type`, the
//   types whose keywords are present are generated (subset), or any value when there are none.
// - enum, const: exactly those values (filtered by `type`), each written compactly as
//   nlohmann's dump() writes it (subset: no whitespace inside, keys in the order given).
//   Combined with any other assertion keyword: refused.
// - object: properties, required, additionalProperties (false / true / a schema). Members come
//   in the schema's order: listed properties first (each optional one present or not, so any
//   subset of the optional ones, in order), then extra members where additionalProperties
//   allows them (subset: no order other than that). When additionalProperties is absent:
//   objects with `properties` get no extra members (as OpenAI's strict mode), objects without
//   get any members. A required name missing from `properties` is a required member after
//   the listed ones, valued by additionalProperties (refused when that is false). Extra members'
//   names are strings without escapes (subset) that are not a listed name.
// - array: items (a schema or false), prefixItems, minItems, maxItems; uniqueItems false.
// - string: minLength, maxLength (in code points; an escape counts as one), pattern
//   (regex_gbnf.h's subset, a search as ECMA-262 says; the pattern's characters appear in their
//   canonical JSON spelling (json_spelling()), other spellings are not produced: subset),
//   format: date, time, date-time (RFC 3339, upper-case 'T' and 'Z', seconds 00-59: subset),
//   uuid, email (dot-atom local part, dot-separated domain labels: subset); other formats are
//   annotations and are ignored. format, pattern and the lengths do not combine (refused).
// - integer, number: minimum, maximum, exclusiveMinimum, exclusiveMaximum, exact (decimal
//   bounds, number_range.h). Integers are written without fraction or exponent, numbers with
//   bounds without exponent (subset); numbers without bounds follow JSON's whole grammar.
// - anyOf, oneOf: any branch (oneOf's exclusivity is not enforced: a value valid for several
//   branches may be generated). allOf with one schema. Not combined with other assertion
//   keywords (refused). Boolean schemas: true is any value, false is refused (and skipped as
//   an anyOf branch).
// - $ref to a JSON pointer into the root document ('#', '#/$defs/x', '#/definitions/x', ...):
//   a rule per target, so recursive schemas work (a left-recursive one is refused by the GBNF
//   parser). Siblings of $ref other than annotations: refused.
// - Annotations accepted and ignored: title, description, $schema, $id, $comment, default,
//   examples, deprecated, readOnly, writeOnly, strict, $defs, definitions, contentEncoding,
//   contentMediaType.
// Any other keyword (if/then/else, not, patternProperties, dependentRequired, uniqueItems true,
// minProperties, contains, multipleOf, ...) is refused: invalid_argument naming it and where.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/structured/gbnf_builder.h"

namespace afd::serve {

// Compiles `schema` (the whole document, which $refs resolve against) into `b`; returns the
// name of the rule for one value. Same as GbnfBuilder::add_schema.
Result<std::string> compile_json_schema(GbnfBuilder& b, const nlohmann::ordered_json& schema,
                                        std::string_view name_hint);

}  // namespace afd::serve
