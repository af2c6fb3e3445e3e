"""The constraint compilers against oracles we did not write, without a model: random walks of
the byte-level matcher (with the JSON key tracker, as a request's mask has it) must give outputs
that Python's jsonschema (with the 2020-12 format checker, and Python's datetime for the RFC 3339
formats it cannot check here) and a duplicate-rejecting json reader accept; regexes must accept
exactly the strings Python's re.fullmatch accepts, ASCII and not. Schemas are generated at random
(objects with and without additionalProperties, arrays with bounds and prefixes, enums, anyOf,
oneOf, $ref/$defs, formats, nesting) and written by hand for each defect found before; every
case must yield a minimum number of finished outputs, so a case cannot pass by producing none.

Run: /usr/bin/python3 tests/structured/test_structured_oracle.py --pdserve build/cli/pdserve
(the oracle tool, build/common/structured/structured_oracle, is found beside the build's root or
through STRUCTURED_ORACLE).
"""

import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys
import unittest

import jsonschema

ORACLE = None
WALKS = 16
MIN_FINISHED = 12  # Of WALKS, per case.


class Oracle:
    def __init__(self, path):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  encoding="utf-8")

    def ask(self, **req):
        self.p.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key in {keys}")
    return dict(pairs)


RFC3339_TIME = re.compile(r"\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", re.ASCII)


def checker():
    """The 2020-12 format checker, plus time and date-time (jsonschema checks them only with the
    rfc3339-validator package, which Debian 12 lacks) through Python's datetime."""
    fc = jsonschema.FormatChecker(formats=list(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers))

    @fc.checks("time", raises=ValueError)
    def is_time(s):
        if not isinstance(s, str):
            return True
        if not RFC3339_TIME.fullmatch(s):
            return False
        datetime.time.fromisoformat(s.replace("Z", "+00:00"))
        return True

    @fc.checks("date-time", raises=ValueError)
    def is_date_time(s):
        if not isinstance(s, str):
            return True
        date, sep, time = s.partition("T")
        if sep != "T" or not RFC3339_TIME.fullmatch(time):
            return False
        datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
        return True

    return fc


FORMATS = checker()


def openapi_nullable(schema):
    """OpenAPI's `nullable: true` (which JSON Schema validators ignore) as JSON Schema says it: the
    schema or null. Everything else is left as written."""
    if isinstance(schema, list):
        return [openapi_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("const", "enum", "default", "examples") else openapi_nullable(v))
           for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def validate(test, schema, text, what):
    schema = openapi_nullable(schema)
    try:
        value = json.loads(text, object_pairs_hook=no_duplicates)
    except ValueError as e:
        test.fail(f"{what}: {text!r}: {e}")
    errors = list(jsonschema.Draft202012Validator(schema, format_checker=FORMATS).iter_errors(value))
    test.assertEqual(errors, [], f"{what}: {text!r} breaks {json.dumps(schema)}: {errors[:1]}")


# --- Random schemas ------------------------------------------------------------------------

NAMES = ["a", "b", "id", "é", "x y", "q\"", "", "kind", "n"]
PATTERNS = [r"^[a-z]{1,4}$", r"\d{2}-\w+", r"^(ab|c)*$", r"[^\s\d]{1,3}", r"^\S+$"]


def gen_value(r, depth=0):
    kinds = ["str", "int", "float", "bool", "null"] + (["list", "obj"] if depth < 2 else [])
    k = r.choice(kinds)
    if k == "str":
        return r.choice(["x", "", "é\"", "a b", "2024-01-01"])
    if k == "int":
        return r.randint(-5, 5)
    if k == "float":
        return r.choice([1.5, -0.25, 2.0])
    if k == "bool":
        return r.choice([True, False])
    if k == "null":
        return None
    if k == "list":
        return [gen_value(r, depth + 1) for _ in range(r.randint(0, 2))]
    return {n: gen_value(r, depth + 1) for n in r.sample(NAMES, r.randint(0, 2))}


def gen_string(r):
    s = {"type": "string"}
    c = r.random()
    if c < 0.3:
        lo = r.randint(0, 3)
        s["minLength"] = lo
        if r.random() < 0.7:
            s["maxLength"] = lo + r.randint(0, 4)
    elif c < 0.5:
        s["pattern"] = r.choice(PATTERNS)
    elif c < 0.7:
        s["format"] = r.choice(["date", "time", "date-time", "uuid"])
    return s


def gen_schema(r, depth=0):
    leaf = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    inner = ["object", "array", "anyOf", "oneOf", "typelist"] if depth < 3 else []
    k = r.choice(leaf + inner * 2)
    if k == "string":
        s = gen_string(r)
    elif k in ("integer", "number", "boolean", "null"):
        s = {"type": k}
    elif k == "enum":
        s = {"enum": [gen_value(r) for _ in range(r.randint(1, 4))]}
        if r.random() < 0.3:
            s["type"] = r.choice(["string", "integer", "number", "null"])
    elif k == "const":
        s = {"const": gen_value(r)}
    elif k == "object":
        names = r.sample(NAMES, r.randint(0, 4))
        s = {"type": "object"}
        if names:
            s["properties"] = {n: gen_schema(r, depth + 1) for n in names}
            req = [n for n in names if r.random() < 0.5]
            if req:
                s["required"] = req
        c = r.random()
        if c < 0.25:
            s["additionalProperties"] = False
        elif c < 0.5:
            s["additionalProperties"] = True
        elif c < 0.8:
            s["additionalProperties"] = gen_schema(r, depth + 1)
    elif k == "array":
        s = {"type": "array"}
        if r.random() < 0.3:
            s["prefixItems"] = [gen_schema(r, depth + 1) for _ in range(r.randint(1, 2))]
            if r.random() < 0.5:
                s["items"] = False
        if "items" not in s and r.random() < 0.8:
            s["items"] = gen_schema(r, depth + 1)
        if r.random() < 0.6:
            lo = r.randint(0, 2)
            s["minItems"] = lo
            if r.random() < 0.6:
                s["maxItems"] = lo + r.randint(0, 3)
    elif k == "anyOf":
        s = {"anyOf": [gen_schema(r, depth + 1) for _ in range(r.randint(1, 3))]}
    elif k == "oneOf":
        if r.random() < 0.5:  # Branches of distinct types.
            types = r.sample(["string", "integer", "boolean", "null", "array", "object"], r.randint(2, 3))
            s = {"oneOf": [gen_schema_of_type(r, t, depth + 1) for t in types]}
        else:  # Objects told apart by a discriminator.
            tags = r.sample(["cat", "dog", "fox", "owl"], r.randint(2, 3))
            s = {"oneOf": [{"type": "object", "properties": {"kind": {"const": t}, "n": gen_schema(r, depth + 1)},
                            "required": ["kind"]} for t in tags]}
    else:
        s = {"type": r.sample(["string", "integer", "null", "boolean"], 2)}
    if r.random() < 0.1 and "type" in s and isinstance(s["type"], str):
        s["nullable"] = True
    return s


def gen_schema_of_type(r, t, depth):
    if t == "string":
        return gen_string(r)
    if t in ("integer", "boolean", "null"):
        return {"type": t}
    if t == "array":
        return {"type": "array", "items": gen_schema(r, depth + 1), "maxItems": r.randint(0, 3)}
    return {"type": "object", "properties": {n: gen_schema(r, depth + 1) for n in r.sample(NAMES, 2)},
            "additionalProperties": r.choice([False, True, {"type": "integer"}])}


def gen_top(r):
    s = gen_schema(r)
    if r.random() < 0.25:  # Through $defs, sometimes recursive.
        node = {"type": "object", "properties": {"v": gen_schema(r, 2),
                                                  "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                           "maxItems": 2}}, "required": ["v"]}
        s = {"$defs": {"node": node, "other": s}, "anyOf": [{"$ref": "#/$defs/node"}, {"$ref": "#/$defs/other"}]}
    return s


# Hand-written: each defect found before, and the shapes that matter most.
SCHEMAS = [
    {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
    {"properties": {"a": {"type": "integer"}, "b": {"type": "null"}}, "additionalProperties": True},
    {"type": "object"},
    {"type": "object", "additionalProperties": {"type": "object"}},
    {"type": "array", "items": {"type": "object"}, "minItems": 2, "maxItems": 3},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "string", "maxLength": 1},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "pattern": r"^\w{2,4}$"},
    {"type": "string", "pattern": r"^[^\d\s]{1,3}$"},
    {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}, {"type": "array", "maxItems": 1}]},
    {"type": "integer", "enum": [1, 1.0, "x", 2.5, None], "nullable": True},
    {"$defs": {"date": {"type": "string", "format": "date"}}, "type": "object",
     "properties": {"when": {"$ref": "#/$defs/date"}, "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["when"]},
]


class JsonSchemaOracle(unittest.TestCase):
    def run_schema(self, schema, what, seed):
        got = ORACLE.ask(op="walk", kind="json_schema", value=json.dumps(schema, ensure_ascii=False), n=WALKS,
                         seed=seed, max_bytes=200)
        if "error" in got:
            return got["error"]
        self.assertGreaterEqual(len(got["outputs"]), MIN_FINISHED, f"{what}: {got}")
        for text in got["outputs"]:
            validate(self, schema, text, what)
        return None

    def test_hand_written_schemas(self):
        for i, schema in enumerate(SCHEMAS):
            with self.subTest(schema=schema):
                err = self.run_schema(schema, f"schema {i}", seed=i + 1)
                self.assertIsNone(err, f"schema {i} refused: {err}")

    def test_refused_or_valid(self):
        """Schemas the compiler may refuse (it cannot enforce them exactly); compiled, every output
        would still have to validate: oneOf whose branches overlap, enum beside other keywords."""
        for i, schema in enumerate([{"oneOf": [{"type": "integer"}, {"type": "number"}]},
                                    {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]},
                                    {"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]},
                                    {"enum": ["abc", "a", "ab"], "minLength": 2},
                                    {"type": "string", "enum": ["a", 1, None]}]):
            with self.subTest(schema=schema):
                self.run_schema(schema, f"maybe-refused schema {i}", seed=i + 30)

    def test_random_schemas(self):
        r = random.Random(2026)
        compiled, refused = 0, []
        for i in range(300):
            schema = gen_top(r)
            with self.subTest(i=i):
                err = self.run_schema(schema, f"random schema {i}", seed=i + 100)
                if err is None:
                    compiled += 1
                else:
                    refused.append((schema, err))
        # Refusals are allowed only for what the compiler documents as unsupported.
        for schema, err in refused:
            self.assertTrue(any(w in err for w in ("not supported", "matches nothing", "never finishes",
                                                   "matches no string", "below", "exceeds", "no value of")),
                            f"{json.dumps(schema)}: {err}")
        self.assertGreater(compiled, 240, f"only {compiled} of 300 compiled; refused: {refused[:3]}")

    def test_what_the_matcher_accepts_validates(self):
        """Every string the matcher takes whole is valid: the walks' outputs with one character
        changed, and the strings each defect was found with."""
        tricky = ['{"a":"x"}', '{"a":1,"a":"x"}', '{"\\u0061":"x"}', '{"b":"x","b":"y"}', '"\\ud83d\\ude00"',
                  '"\\ud83d"', '"ab"', '"a"', '"2023-02-29"', '"2023-04-31"', '"0000-01-01"', '"2024-02-29"',
                  '{"when":"2023-02-29"}', '1', '1.0', 'null', '"x"', '[{}, {}]', '{"a":1,"b":null,"c":"d"}']
        r = random.Random(5)
        alphabet = list('{}[]":,0123456789abé\\u') + ["null", "true", "\\ud83d\\ude00"]
        for i, schema in enumerate(SCHEMAS):
            walked = ORACLE.ask(op="walk", kind="json_schema", value=json.dumps(schema), n=WALKS, seed=i + 50,
                                max_bytes=120)["outputs"]
            candidates = list(tricky)
            for text in walked:
                for _ in range(20):
                    j = r.randrange(len(text) + 1)
                    candidates.append(text[:j] + r.choice(alphabet) + text[j + 1:])
                    candidates.append(text[:j] + r.choice(alphabet) + text[j:])
            got = ORACLE.ask(op="match", kind="json_schema", value=json.dumps(schema), strings=candidates)["results"]
            for text, ok in zip(candidates, got):
                if ok:
                    validate(self, schema, text, f"schema {i} took")

    def test_dates_are_pythons(self):
        """format date takes exactly the dates Python's datetime takes (the 2020-12 checker)."""
        strings, expected = [], []
        for year in ["0000", "0001", "0004", "0100", "0400", "1900", "2000", "2023", "2024", "9999"]:
            for month in range(0, 14):
                for day in range(0, 33):
                    d = f"{year}-{month:02d}-{day:02d}"
                    strings.append(json.dumps(d))
                    try:
                        datetime.date.fromisoformat(d)
                        expected.append(True)
                    except ValueError:
                        expected.append(False)
        got = ORACLE.ask(op="match", kind="json_schema", value='{"type":"string","format":"date"}',
                         strings=strings)["results"]
        wrong = [s for s, g, e in zip(strings, got, expected) if g != e]
        self.assertEqual(wrong, [])
        self.assertGreater(sum(expected), 3000)

    def test_json_object_mode_never_repeats_a_key(self):
        got = ORACLE.ask(op="walk", kind="json_object", n=200, seed=7, max_bytes=120)
        self.assertGreaterEqual(len(got["outputs"]), 190, got)
        repeated_names = 0
        for text in got["outputs"]:
            value = json.loads(text, object_pairs_hook=no_duplicates)
            self.assertIsInstance(value, dict)
            repeated_names += text.count('"":')  # The walks do try keys again.
        self.assertGreater(repeated_names, 0)

    def test_tool_call_arrays(self):
        """The forced tool-call shape (an array of {name, parameters}, minItems 1) with a tool whose
        parameters refer into their own $defs, as structured_request builds it."""
        params = {"$defs": {"date": {"type": "string", "format": "date"}}, "type": "object",
                  "properties": {"when": {"$ref": "#/$defs/tool0/$defs/date"}}, "required": ["when"]}
        schema = {"type": "array", "minItems": 1,
                  "items": {"type": "object", "properties": {"name": {"const": "book"},
                                                             "parameters": {"$ref": "#/$defs/tool0"}},
                            "required": ["name", "parameters"]},
                  "$defs": {"tool0": params}}
        self.assertIsNone(self.run_schema(schema, "tool calls", seed=5))


# --- Regexes --------------------------------------------------------------------------------

REGEXES = [r"\w+", r"\W{1,3}", r"[^\d\s]+", r"\S\s\S", r"(\d|\D)+x", r"[\w-]+@\w+\.(com|org)",
           r".{2}", r"[^a-z]", r"(ab|c)*d?", r"\d{2,3}", r"[^\w]", r"\D*", r"[\s\d]+", r"a{,2}b{1,}c?",
           r"(?:x|yz){2}", r"[\u00e0-\u00ff]+", r"[^\W\d]+", r"\.\*\\"]
ALPHABET = ["a", "b", "c", "d", "x", "y", "z", "0", "5", "9", "_", "-", "@", ".", ",", " ", "\t", "\n", "é", "ß",
            "٣", "²", "Ⅻ", "\xa0", "\u2003", "😀", "中", "!", "\u200b", "\u0300", "ǅ", "\x1c", "\x85", "*", "\\"]


class RegexOracle(unittest.TestCase):
    def test_same_strings_as_pythons_re(self):
        r = random.Random(11)
        for pattern in REGEXES:
            with self.subTest(pattern=pattern):
                walked = ORACLE.ask(op="walk", kind="regex", value=pattern, n=WALKS, seed=3, max_bytes=12)
                self.assertNotIn("error", walked, pattern)
                self.assertGreaterEqual(len(walked["outputs"]), MIN_FINISHED, walked)
                for s in walked["outputs"]:
                    self.assertIsNotNone(re.fullmatch(pattern, s), f"{pattern}: walk gave {s!r}")
                strings = [s for s in walked["outputs"]]
                strings += ["".join(r.choice(ALPHABET) for _ in range(r.randint(0, 5))) for _ in range(400)]
                for s in walked["outputs"][:5]:  # One character changed.
                    for _ in range(5):
                        if s:
                            i = r.randrange(len(s))
                            strings.append(s[:i] + r.choice(ALPHABET) + s[i + 1:])
                got = ORACLE.ask(op="match", kind="regex", value=pattern, strings=strings)["results"]
                expected = [re.fullmatch(pattern, s) is not None for s in strings]
                wrong = [(s, g) for s, g, e in zip(strings, got, expected) if g != e]
                self.assertEqual(wrong, [], f"{pattern}: ours differs from re.fullmatch")
                self.assertGreater(sum(expected), 0, f"{pattern}: no string matched: a weak case")

    def test_refusals_are_pythons(self):
        for pattern in ["a**", "a{1}{1}", "a???", "*a", "(a", "a)"]:
            with self.assertRaises(re.error):
                re.compile(pattern)
            self.assertIn("error", ORACLE.ask(op="match", kind="regex", value=pattern, strings=[]), pattern)


def main():
    global ORACLE
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdserve", required=True)
    args, rest = parser.parse_known_args()
    path = os.environ.get("STRUCTURED_ORACLE") or os.path.join(
        os.path.dirname(os.path.abspath(args.pdserve)), "common", "structured", "structured_oracle")
    ORACLE = Oracle(path)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        ORACLE.close()


if __name__ == "__main__":
    main()
