#!/usr/bin/env python3
"""Open rao's Parquet files with pyarrow and DuckDB and print facts as JSON (read by a Rust test)."""
import json
import sys

import duckdb
import pyarrow.parquet as pq

trees, tasks = sys.argv[1], sys.argv[2]
t = pq.read_table(trees)
rows = t.to_pylist()
first_turn = rows[0]["turns"][0]
con = duckdb.connect()
nodes, mean_score, roots = con.execute(
    f"select count(*), avg(score), count(*) filter (where parent_id is null) from read_parquet('{trees}')"
).fetchone()
actions = con.execute(
    f"select count(*) from (select unnest(turns) as t from read_parquet('{trees}')) where t.action like 'spawn%'"
).fetchone()[0]
ntasks = con.execute(f"select count(*) from read_parquet('{tasks}')").fetchone()[0]
print(json.dumps({
    "pyarrow_rows": t.num_rows,
    "columns": t.schema.names,
    "turn_type": str(t.schema.field("turns").type),
    "first_completion": first_turn["completion_ids"],
    "duckdb_nodes": nodes,
    "duckdb_mean_score": mean_score,
    "duckdb_roots": roots,
    "duckdb_spawn_actions": actions,
    "tasks": ntasks,
}))
