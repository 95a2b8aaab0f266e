"""Validate pipeline files against rao's JSON Schema with the `jsonschema` package, then break a
copy of each in a known place and report where the validator puts the error.

Usage: check_schema.py SCHEMA FILE...   Prints one JSON object per file:
  {"file", "errors": [...] (of the file as it is), "broken": [{"what", "expect", "path", "message"}]}
where `path` is the JSON path of the best-matching error of the broken copy (null if it validated).
       check_schema.py --as-is SCHEMA FILE...   Only {"file", "errors"}: files that are broken already.
"""

import copy
import json
import sys

import jsonschema
import yaml


def errors(validator, doc):
    return [{"path": list(e.absolute_path), "message": e.message} for e in validator.iter_errors(doc)]


def best(validator, doc):
    e = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    return None if e is None else {"path": list(e.absolute_path), "message": e.message}


def first_kind_stage(stages, prefix):
    """(path, stage) of the first stage that has a kind, looking into loop bodies."""
    for name, stage in stages.items():
        if "kind" in stage:
            return prefix + [name], stage
        found = first_kind_stage(stage.get("stages", {}), prefix + [name, "stages"])
        if found:
            return found
    return None


def breakages(doc):
    """(what, expected error path, broken copy) for each way of breaking `doc`."""
    out = []
    if "extends" in doc:
        d = copy.deepcopy(doc)
        d["extends"] = 3
        out.append(("extends is a number", ["extends"], d))
        d = copy.deepcopy(doc)
        d["set"]["stagse.rollout.params.mode"] = "flat"
        out.append(("a set path that is no override path", ["set"], d))
        d = copy.deepcopy(doc)
        d["stages"] = {}
        out.append(("a variant with stages", [], d))
        return out
    d = copy.deepcopy(doc)
    d["seed"] = "one"
    out.append(("seed is text", ["seed"], d))
    d = copy.deepcopy(doc)
    path, stage = first_kind_stage(d["stages"], ["stages"])
    stage.setdefault("params", {})["no_such_param"] = 1
    out.append(("an unknown param", path + ["params"], d))
    d = copy.deepcopy(doc)
    path, stage = first_kind_stage(d["stages"], ["stages"])
    stage["kind"] = "no_such_kind"
    out.append(("an unknown kind", path + ["kind"], d))
    d = copy.deepcopy(doc)
    nested = first_nested_param(d["stages"], ["stages"])
    if nested:
        path, value = nested
        value["no_such_key"] = 1
        out.append(("an unknown key in a nested param", path, d))
    return out


def first_nested_param(stages, prefix):
    """(path, mapping) of the first param of a typed kind whose value is a mapping."""
    for name, stage in stages.items():
        if stage.get("kind") not in (None, "shell", "noop"):
            for key, value in stage.get("params", {}).items():
                if isinstance(value, dict):
                    return prefix + [name, "params", key], value
        found = first_nested_param(stage.get("stages", {}), prefix + [name, "stages"])
        if found:
            return found
    return None


def main():
    args = sys.argv[1:]
    as_is = args[0] == "--as-is"
    if as_is:
        args = args[1:]
    schema = json.load(open(args[0]))
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in args[1:]:
        doc = yaml.safe_load(open(path))
        if as_is:
            print(json.dumps({"file": path, "errors": errors(validator, doc)}))
            continue
        broken = []
        for what, expect, d in breakages(doc):
            broken.append({"what": what, "expect": expect, **(best(validator, d) or {"path": None, "message": None})})
        print(json.dumps({"file": path, "errors": errors(validator, doc), "broken": broken}))


main()
