//! TensorBoard event files: TFRecord framing (length, masked CRC-32C, payload, masked CRC-32C)
//! around `Event` protobufs (prost messages with TensorFlow's field numbers). Scalars are
//! `simple_value`s; the parameters and the report's location are text-plugin summaries.

use std::io::Write;
use std::path::Path;

use prost::Message;

use crate::results::{RunInfo, RunResults};
use crate::tracking::{Scalar, params, scalars};

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    #[prost(oneof = "Value", tags = "2, 8")]
    value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Value {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    /// `DT_STRING`.
    #[prost(int32, tag = "1")]
    dtype: i32,
    /// Empty: a scalar.
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShape {}

const DT_STRING: i32 = 7;

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord.
fn record(out: &mut Vec<u8>, payload: &[u8]) {
    let len = (payload.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc(payload).to_le_bytes());
}

fn text(tag: &str, body: String, time: f64) -> Event {
    Event {
        wall_time: time,
        step: 0,
        what: Some(What::Summary(Summary {
            value: vec![SummaryValue {
                tag: tag.into(),
                metadata: Some(SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "text".into(), content: vec![] }) }),
                value: Some(Value::Tensor(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShape {}),
                    string_val: vec![body.into_bytes()],
                })),
            }],
        })),
    }
}

/// An event file written while the run goes (TensorBoard reads a growing file); the export at
/// the run's end replaces it with the whole run's.
pub struct LiveFile {
    file: std::fs::File,
}

impl LiveFile {
    pub fn create(dir: &Path, started_at: f64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut file = std::fs::File::create(dir.join(format!("events.out.tfevents.{}.rao", started_at as i64)))?;
        let mut bytes = Vec::new();
        let version = Event { wall_time: started_at, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) };
        record(&mut bytes, &version.encode_to_vec());
        file.write_all(&bytes)?;
        Ok(LiveFile { file })
    }

    pub fn write(&mut self, scalars: &[Scalar]) -> anyhow::Result<()> {
        let mut bytes = Vec::new();
        for s in scalars {
            record(&mut bytes, &scalar_event(s).encode_to_vec());
        }
        self.file.write_all(&bytes)?;
        self.file.flush()?;
        Ok(())
    }
}

fn scalar_event(s: &Scalar) -> Event {
    let v = SummaryValue { tag: s.key.clone(), metadata: None, value: Some(Value::SimpleValue(s.value as f32)) };
    Event { wall_time: s.time, step: s.step, what: Some(What::Summary(Summary { value: vec![v] })) }
}

/// Write the run's event file (and its report page) into `dir`, replacing an earlier export.
pub fn write_run(dir: &Path, res: &RunResults, run: &RunInfo, page: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut events = vec![Event { wall_time: run.started_at, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) }];
    events.extend(scalars(res).iter().map(scalar_event));
    let table: String = params(res).iter().map(|(k, v)| format!("| `{k}` | {} |\n", v.replace('|', "\\|"))).collect();
    let overrides = if res.overrides.is_empty() { "none".to_string() } else { res.overrides.join(" ") };
    let about = format!(
        "pipeline **{}** (`{}`), seed {}, run {} ({}), code {}; overrides: {overrides}; report: `report.html` in this directory",
        res.pipeline, res.file, res.seed, run.run_id, run.status, run.code_version
    );
    events.push(text("run", about, run.started_at));
    events.push(text("params", format!("| parameter | value |\n|---|---|\n{table}"), run.started_at));
    let mut bytes = Vec::new();
    for e in &events {
        record(&mut bytes, &e.encode_to_vec());
    }
    for old in std::fs::read_dir(dir)?.flatten() {
        if old.file_name().to_string_lossy().starts_with("events.out.tfevents.") {
            std::fs::remove_file(old.path())?;
        }
    }
    let name = format!("events.out.tfevents.{}.rao", run.started_at as i64);
    let mut f = std::fs::File::create(dir.join(name))?;
    f.write_all(&bytes)?;
    std::fs::write(dir.join("report.html"), page)?;
    Ok(())
}
