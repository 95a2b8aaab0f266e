"""Write the libFuzzer dictionary for the pipeline format: every property name and enum value in
schemas/pipeline.schema.json (so new kinds and params are picked up), YAML syntax, edge-case
numbers, substitutions, `# set:` override headers and paths. Run by benches/scripts/fuzz.sh.

    python3 benches/fuzz/make_dict.py SCHEMA OUT
"""

import json
import sys

SYNTAX = [": ", "- ", "\n  ", "\n    ", "{", "}", "[", "]", ", ", "&a ", "*a", "<<: *a", "!!str ", "!!int ",
          "!!float ", "!!map", "!!seq", "!tag ", "|\n", ">-\n", "---\n", "...\n", "? ", "'", "\"", "\\u0000",
          "\t", "#", "%YAML 1.2\n", "~", "null", "true", "false", "yes"]
NUMBERS = ["0", "-1", "1e20", "1e300", "-0.0", ".nan", ".inf", "-.inf", "0x10", "0o7", "4294967295", "4294967296",
           "18446744073709551615", "18446744073709551616", "9223372036854775808", "1_000", "1h", "90m", "30s",
           "2.5d", "1e20s"]
REFERENCES = ["${params.", "${matrix.", "${loop.iteration}", "${loop.", "${inputs.", "${outputs.", "${seed}",
              "${env.", "}", "loop.", ".out", "@1", "[a=1]", "# set: ", "# set: stages.", "stages.a.params.", "=",
              "s3://bucket/", "file:///", "../", "/dev/", "textcraft-synth.yaml", "fuzz-input.yaml"]


def schema_words(schema):
    props, enums = set(), set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "properties" and isinstance(v, dict):
                    props.update(p for p in v if not p.startswith("$"))
                if k in ("enum", "const"):
                    enums.update(e for e in (v if isinstance(v, list) else [v]) if isinstance(e, str))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(schema)
    return sorted(props) + sorted(enums)


def quote(token):
    body = "".join("\\\\" if c == "\\" else '\\"' if c == '"' else c if 32 <= ord(c) < 127 else "\\x%02x" % ord(c)
                   for c in token)
    return '"%s"' % body


def main(schema_path, out_path):
    with open(schema_path) as f:
        words = schema_words(json.load(f))
    tokens = list(dict.fromkeys(words + SYNTAX + NUMBERS + REFERENCES))
    with open(out_path, "w") as f:
        f.write("".join(quote(t) + "\n" for t in tokens))


if __name__ == "__main__":
    main(*sys.argv[1:])
