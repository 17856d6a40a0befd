// How the XML tool-call formats (Qwen3-Coder's <parameter=k>, GLM's
// <arg_value>) type their argument values. The templates write a string
// argument as its bare text and anything else as JSON (Qwen3-Coder: Python's
// str() for booleans and null, "True", "None"), so the text alone cannot say
// whether "42" was the number or the string; the parameter's schema decides:
//   - a schema that allows only strings: the text, as it is;
//   - a value that parses as JSON of a non-string type the schema allows
//     (True / False / None as Python writes them count as booleans and
//     null): that value;
//   - else, when the schema allows strings: the text, as it is;
//   - a parameter of no known type (not in the schema, or a schema without
//     types): JSON when the text parses as JSON, else the text as a string;
//   - a value of none of the allowed types: the text as a string (the call
//     is kept; the client sees what the model wrote).
// JSON values are trimmed of surrounding whitespace; strings are not.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace baton {

// JSON types as bits; 0 means any.
inline constexpr uint8_t kArgString = 1, kArgInteger = 2, kArgNumber = 4, kArgBoolean = 8, kArgObject = 16,
                         kArgArray = 32, kArgNull = 64;

// The types a parameter's JSON Schema allows: its "type" (a name or a
// list), else the union over anyOf / oneOf branches, else the types of its
// enum / const values, else "properties" means an object; 0 (any) when
// none of these says (a $ref, {}).
uint8_t schema_argument_types(const nlohmann::ordered_json& schema);

// The JSON text of an argument written as `text`, typed as above.
std::string typed_argument(std::string_view text, uint8_t types);

}  // namespace baton
