#!/usr/bin/env python3
"""Facts about node tables from DuckDB, as JSON (read by a Rust test): key uniqueness, empty label
columns, and children joined to their parents per mode.  Usage: check_trees.py TREES.parquet"""
import json
import sys

import duckdb

path = sys.argv[1]
con = duckdb.connect()
con.execute(f"create view n as select * from read_parquet('{path}')")
key = 'run, iteration, mode, task_id, "group", node_id'
rows, distinct_keys = con.execute(f"select count(*), count(distinct ({key})) from n").fetchone()
empty = {
    c: con.execute(f"select count(*) from n where {c} is null or {c} = ''").fetchone()[0]
    for c in ["run", "env", "mode", "band"]
}
per_mode = {}
for mode, nodes, roots, children in con.execute(
    "select mode, count(*), count(*) filter (where parent_id is null), count(*) filter (where parent_id is not null) "
    "from n group by mode order by mode"
).fetchall():
    joined, depth_ok = con.execute(
        """select count(*), count(*) filter (where c.depth = p.depth + 1)
           from n c join n p
             on c.run = p.run and c.iteration = p.iteration and c.mode = p.mode and c.task_id = p.task_id
            and c."group" = p."group" and c.parent_id = p.node_id
           where c.mode = ?""",
        [mode],
    ).fetchone()
    per_mode[mode] = {"nodes": nodes, "roots": roots, "children": children, "joined": joined, "depth_ok": depth_ok}
bands = [b for (b,) in con.execute("select distinct band from n order by band").fetchall()]
print(json.dumps({"rows": rows, "distinct_keys": distinct_keys, "empty": empty, "per_mode": per_mode, "bands": bands}))
