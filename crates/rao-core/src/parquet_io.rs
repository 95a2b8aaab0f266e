//! Trajectory trees as Arrow/Parquet: one row per node, nested turns. The files open as they are
//! in pyarrow, DuckDB and Polars. The schema is documented in `schemas/trees.md`.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, RecordBatch,
    StringBuilder, StructBuilder, UInt32Builder,
};
use arrow::datatypes::{DataType, Field, Fields, Float32Type, Float64Type, Int32Type, Int64Type, Schema, UInt32Type};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::tree::{NodeRecord, Turn};

pub type IoResult<T> = Result<T, IoError>;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("column `{0}` is missing or has the wrong type")]
    Column(String),
    #[error("column `{column}`, row {row}: {source}")]
    Name {
        column: &'static str,
        row: usize,
        #[source]
        source: crate::tree::UnknownName,
    },
}

fn list_of(dt: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", dt, true)))
}

fn turn_fields() -> Fields {
    Fields::from(vec![
        Field::new("completion_ids", list_of(DataType::UInt32), true),
        Field::new("logprobs", list_of(DataType::Float32), true),
        Field::new("action", DataType::Utf8, true),
        Field::new("observation_ids", list_of(DataType::UInt32), true),
        Field::new("observation", DataType::Utf8, true),
    ])
}

fn counter_fields() -> Fields {
    Fields::from(vec![Field::new("name", DataType::Utf8, true), Field::new("count", DataType::Int64, true)])
}

/// The node table's schema.
pub fn node_schema() -> Schema {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let i = |n: &str| Field::new(n, DataType::Int32, false);
    let oi = |n: &str| Field::new(n, DataType::Int32, true);
    let of = |n: &str| Field::new(n, DataType::Float64, true);
    Schema::new(vec![
        s("run"),
        i("iteration"),
        s("env"),
        s("mode"),
        s("band"),
        s("task_id"),
        i("group"),
        i("node_id"),
        oi("parent_id"),
        i("depth"),
        i("child_index"),
        oi("spawn_step"),
        i("policy_version"),
        s("goal"),
        Field::new("goal_ids", list_of(DataType::UInt32), false),
        s("status"),
        Field::new("score", DataType::Float64, false),
        Field::new("judge", DataType::Utf8, true),
        of("local_reward"),
        of("baseline"),
        of("advantage"),
        of("depth_weight"),
        i("steps"),
        s("token_space"),
        Field::new("prompt_ids", list_of(DataType::UInt32), false),
        Field::new("turns", list_of(DataType::Struct(turn_fields())), false),
        i("context_tokens"),
        i("generated_tokens"),
        Field::new("result", DataType::Utf8, true),
        Field::new("counters", list_of(DataType::Struct(counter_fields())), false),
        Field::new("started_ms", DataType::Float64, false),
        Field::new("finished_ms", DataType::Float64, false),
    ])
}

fn u32_list(rows: impl Iterator<Item = Vec<u32>>) -> ArrayRef {
    let mut b = ListBuilder::new(UInt32Builder::new());
    for r in rows {
        b.values().append_slice(&r);
        b.append(true);
    }
    Arc::new(b.finish())
}

/// Encode nodes as one Parquet file (zstd).
pub fn nodes_to_parquet(nodes: &[NodeRecord]) -> IoResult<Bytes> {
    let schema = Arc::new(node_schema());
    let strings = |f: &dyn Fn(&NodeRecord) -> Option<&str>| -> ArrayRef {
        let mut b = StringBuilder::new();
        for n in nodes {
            b.append_option(f(n));
        }
        Arc::new(b.finish())
    };
    let ints = |f: &dyn Fn(&NodeRecord) -> Option<i32>| -> ArrayRef {
        let mut b = Int32Builder::new();
        for n in nodes {
            b.append_option(f(n));
        }
        Arc::new(b.finish())
    };
    let floats = |f: &dyn Fn(&NodeRecord) -> Option<f64>| -> ArrayRef {
        let mut b = Float64Builder::new();
        for n in nodes {
            b.append_option(f(n));
        }
        Arc::new(b.finish())
    };
    let mut turns = ListBuilder::new(StructBuilder::from_fields(turn_fields(), nodes.len()));
    for n in nodes {
        let sb = turns.values();
        for t in &n.turns {
            push_turn(sb, t);
        }
        turns.append(true);
    }
    let mut counters = ListBuilder::new(StructBuilder::from_fields(counter_fields(), nodes.len()));
    for n in nodes {
        let sb = counters.values();
        for (name, count) in &n.counters {
            sb.field_builder::<StringBuilder>(0).unwrap().append_value(name);
            sb.field_builder::<Int64Builder>(1).unwrap().append_value(*count);
            sb.append(true);
        }
        counters.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        strings(&|n| Some(&n.run)),
        ints(&|n| Some(n.iteration)),
        strings(&|n| Some(&n.env)),
        strings(&|n| Some(n.mode.as_str())),
        strings(&|n| Some(&n.band)),
        strings(&|n| Some(&n.task_id)),
        ints(&|n| Some(n.group)),
        ints(&|n| Some(n.node_id)),
        ints(&|n| n.parent_id),
        ints(&|n| Some(n.depth)),
        ints(&|n| Some(n.child_index)),
        ints(&|n| n.spawn_step),
        ints(&|n| Some(n.policy_version)),
        strings(&|n| Some(&n.goal)),
        u32_list(nodes.iter().map(|n| n.goal_ids.clone())),
        strings(&|n| Some(n.status.as_str())),
        floats(&|n| Some(n.score)),
        strings(&|n| n.judge.as_deref()),
        floats(&|n| n.local_reward),
        floats(&|n| n.baseline),
        floats(&|n| n.advantage),
        floats(&|n| n.depth_weight),
        ints(&|n| Some(n.steps)),
        strings(&|n| Some(&n.token_space)),
        u32_list(nodes.iter().map(|n| n.prompt_ids.clone())),
        Arc::new(turns.finish()),
        ints(&|n| Some(n.context_tokens)),
        ints(&|n| Some(n.generated_tokens)),
        strings(&|n| n.result.as_deref()),
        Arc::new(counters.finish()),
        floats(&|n| Some(n.started_ms)),
        floats(&|n| Some(n.finished_ms)),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    write_batch(&batch)
}

fn push_turn(sb: &mut StructBuilder, t: &Turn) {
    {
        let b = sb.field_builder::<ListBuilder<Box<dyn arrow::array::ArrayBuilder>>>(0).unwrap();
        let vals = b.values().as_any_mut().downcast_mut::<UInt32Builder>().unwrap();
        vals.append_slice(&t.completion_ids);
        b.append(true);
    }
    {
        let b = sb.field_builder::<ListBuilder<Box<dyn arrow::array::ArrayBuilder>>>(1).unwrap();
        let vals = b.values().as_any_mut().downcast_mut::<Float32Builder>().unwrap();
        vals.append_slice(&t.logprobs);
        b.append(true);
    }
    sb.field_builder::<StringBuilder>(2).unwrap().append_value(&t.action);
    {
        let b = sb.field_builder::<ListBuilder<Box<dyn arrow::array::ArrayBuilder>>>(3).unwrap();
        let vals = b.values().as_any_mut().downcast_mut::<UInt32Builder>().unwrap();
        vals.append_slice(&t.observation_ids);
        b.append(true);
    }
    sb.field_builder::<StringBuilder>(4).unwrap().append_value(&t.observation);
    sb.append(true);
}

/// Write one record batch as a Parquet file.
pub fn write_batch(batch: &RecordBatch) -> IoResult<Bytes> {
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?)).build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(Bytes::from(buf))
}

/// Read every batch of a Parquet file.
pub fn read_batches(bytes: Bytes) -> IoResult<Vec<RecordBatch>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.with_batch_size(8192).build()?;
    Ok(reader.collect::<Result<Vec<_>, _>>()?)
}

fn col<'a>(b: &'a RecordBatch, name: &str) -> IoResult<&'a ArrayRef> {
    b.column_by_name(name).ok_or_else(|| IoError::Column(name.into()))
}

fn u32s(a: &dyn Array) -> Vec<u32> {
    a.as_primitive::<UInt32Type>().values().to_vec()
}

/// Row `r` of a column of names (`mode`, `status`) as the enum it names.
fn name<T: std::str::FromStr<Err = crate::tree::UnknownName>>(
    column: &'static str,
    a: &arrow::array::StringArray,
    r: usize,
) -> IoResult<T> {
    a.value(r).parse().map_err(|source| IoError::Name { column, row: r, source })
}

/// Decode nodes from a Parquet file written by [`nodes_to_parquet`].
pub fn nodes_from_parquet(bytes: Bytes) -> IoResult<Vec<NodeRecord>> {
    let mut out = Vec::new();
    for b in read_batches(bytes)? {
        let wrong = |n: &str| IoError::Column(n.into());
        let s = |n: &str| -> IoResult<_> { Ok(col(&b, n)?.as_string_opt::<i32>().ok_or_else(|| wrong(n))?.clone()) };
        let i = |n: &str| -> IoResult<_> { Ok(col(&b, n)?.as_primitive_opt::<Int32Type>().ok_or_else(|| wrong(n))?.clone()) };
        let f = |n: &str| -> IoResult<_> { Ok(col(&b, n)?.as_primitive_opt::<Float64Type>().ok_or_else(|| wrong(n))?.clone()) };
        let l = |n: &str| -> IoResult<_> { Ok(col(&b, n)?.as_list_opt::<i32>().ok_or_else(|| wrong(n))?.clone()) };
        let (run, env, task, goal, status, judge, result) =
            (s("run")?, s("env")?, s("task_id")?, s("goal")?, s("status")?, s("judge")?, s("result")?);
        let mode = s("mode")?;
        // Columns added later: files written before them read as empty strings.
        let (band, token_space) = (s("band").ok(), s("token_space").ok());
        let text_or_empty =
            |a: &Option<arrow::array::StringArray>, r: usize| a.as_ref().map(|a| a.value(r).to_string()).unwrap_or_default();
        let (iteration, group, node_id, parent, depth, child, spawn, version, steps, ctx, gen_) = (
            i("iteration")?,
            i("group")?,
            i("node_id")?,
            i("parent_id")?,
            i("depth")?,
            i("child_index")?,
            i("spawn_step")?,
            i("policy_version")?,
            i("steps")?,
            i("context_tokens")?,
            i("generated_tokens")?,
        );
        let (score, lr, base, adv, dw, st, fin) =
            (f("score")?, f("local_reward")?, f("baseline")?, f("advantage")?, f("depth_weight")?, f("started_ms")?, f("finished_ms")?);
        let (goal_ids, prompt_ids, turns, counters) = (l("goal_ids")?, l("prompt_ids")?, l("turns")?, l("counters")?);
        let opt_i = |a: &arrow::array::Int32Array, r: usize| (!a.is_null(r)).then(|| a.value(r));
        let opt_f = |a: &arrow::array::Float64Array, r: usize| (!a.is_null(r)).then(|| a.value(r));
        let opt_s = |a: &arrow::array::StringArray, r: usize| (!a.is_null(r)).then(|| a.value(r).to_string());
        for r in 0..b.num_rows() {
            let tv = turns.value(r);
            let ts = tv.as_struct();
            let mut node_turns = Vec::with_capacity(ts.len());
            for k in 0..ts.len() {
                node_turns.push(Turn {
                    completion_ids: u32s(ts.column(0).as_list::<i32>().value(k).as_ref()),
                    logprobs: ts.column(1).as_list::<i32>().value(k).as_primitive::<Float32Type>().values().to_vec(),
                    action: ts.column(2).as_string::<i32>().value(k).to_string(),
                    observation_ids: u32s(ts.column(3).as_list::<i32>().value(k).as_ref()),
                    observation: ts.column(4).as_string::<i32>().value(k).to_string(),
                });
            }
            let cv = counters.value(r);
            let cs = cv.as_struct();
            let names = cs.column(0).as_string::<i32>();
            let counts = cs.column(1).as_primitive::<Int64Type>();
            out.push(NodeRecord {
                run: run.value(r).into(),
                iteration: iteration.value(r),
                env: env.value(r).into(),
                mode: name("mode", &mode, r)?,
                band: text_or_empty(&band, r),
                token_space: text_or_empty(&token_space, r),
                task_id: task.value(r).into(),
                group: group.value(r),
                node_id: node_id.value(r),
                parent_id: opt_i(&parent, r),
                depth: depth.value(r),
                child_index: child.value(r),
                spawn_step: opt_i(&spawn, r),
                policy_version: version.value(r),
                goal: goal.value(r).into(),
                goal_ids: u32s(goal_ids.value(r).as_ref()),
                status: name("status", &status, r)?,
                score: score.value(r),
                judge: opt_s(&judge, r),
                local_reward: opt_f(&lr, r),
                baseline: opt_f(&base, r),
                advantage: opt_f(&adv, r),
                depth_weight: opt_f(&dw, r),
                steps: steps.value(r),
                prompt_ids: u32s(prompt_ids.value(r).as_ref()),
                turns: node_turns,
                context_tokens: ctx.value(r),
                generated_tokens: gen_.value(r),
                result: opt_s(&result, r),
                counters: (0..cs.len()).map(|k| (names.value(k).to_string(), counts.value(k))).collect(),
                started_ms: st.value(r),
                finished_ms: fin.value(r),
            });
        }
    }
    Ok(out)
}

/// A tiny helper for flat tables (tasks, metrics): named columns of simple types.
pub enum Column {
    Str(Vec<String>),
    OptStr(Vec<Option<String>>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
}

pub fn table_to_parquet(columns: Vec<(&str, Column)>) -> IoResult<Bytes> {
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (name, c) in columns {
        let (dt, arr): (DataType, ArrayRef) = match c {
            Column::Str(v) => (DataType::Utf8, Arc::new(arrow::array::StringArray::from(v))),
            Column::OptStr(v) => (DataType::Utf8, Arc::new(arrow::array::StringArray::from(v))),
            Column::I64(v) => (DataType::Int64, Arc::new(arrow::array::Int64Array::from(v))),
            Column::F64(v) => (DataType::Float64, Arc::new(arrow::array::Float64Array::from(v))),
            Column::Bool(v) => {
                let mut b = BooleanBuilder::new();
                b.append_slice(&v);
                (DataType::Boolean, Arc::new(b.finish()))
            }
        };
        fields.push(Field::new(name, dt, true));
        arrays.push(arr);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?;
    write_batch(&batch)
}
