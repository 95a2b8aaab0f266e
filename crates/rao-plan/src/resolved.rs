//! The pipeline as resolved (after `--set`), in the two forms rao uses it: as a value (reports,
//! comparisons, tracking, checks of `--set`), and as the redacted JSON that every run record
//! holds. The record's text is rendered once, when the pipeline is compiled, and kept in the plan
//! cache with it; the value is kept there as exact MessagePack and decoded on first use — a fully
//! cached `rao run` writes its record without ever decoding or re-serialising the pipeline.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::secrets::Redacted;

#[derive(Clone, Serialize, Deserialize)]
pub struct ResolvedPipeline {
    /// The value as MessagePack: floats kept bit for bit (JSON text read back may not be).
    #[serde(serialize_with = "as_bytes", deserialize_with = "from_bytes")]
    packed: Vec<u8>,
    /// Redacted, pretty-printed and indented as a field of a pretty-printed run record.
    record_text: String,
    /// The `tracking:` section (or `null`): a run sets up its trackers without the whole value.
    tracking: Value,
    #[serde(skip)]
    value: OnceLock<Arc<Value>>,
}

impl ResolvedPipeline {
    pub fn new(value: Value) -> Self {
        let packed = rmp_serde::to_vec(&value).expect("a JSON value packs");
        let text = serde_json::to_string_pretty(&Redacted(&value)).expect("a JSON value serialises");
        // Nested one level in the record: every line after the first moves right by one indent.
        // JSON strings hold no raw newlines, so this touches only the layout.
        let record_text = text.replace('\n', "\n  ");
        let tracking = value["tracking"].clone();
        ResolvedPipeline { packed, record_text, tracking, value: OnceLock::from(Arc::new(value)) }
    }

    /// The value (decoded on first use; `null` if the packed bytes are damaged — they are rao's own).
    pub fn value(&self) -> &Arc<Value> {
        self.value.get_or_init(|| Arc::new(rmp_serde::from_slice(&self.packed).unwrap_or(Value::Null)))
    }

    pub fn tracking(&self) -> &Value {
        &self.tracking
    }

    /// Warnings for `--set params.…` overrides that no stage reads ([`crate::overrides::unused_params`]);
    /// without such overrides the value is not decoded.
    pub fn unused_params(&self, overrides: &[String], via: &str) -> Vec<String> {
        if !overrides.iter().any(|o| o.starts_with("params.")) {
            return Vec::new();
        }
        crate::overrides::unused_params(self.value(), overrides, via)
    }

    /// What a run record writes: the redacted pipeline, as JSON. The text is checked here, once
    /// for a run that writes its record several times (it may come from the plan cache); text
    /// that is not JSON is replaced by the value, redacted when written.
    pub fn for_record(&self) -> RecordedPipeline {
        match RawValue::from_string(self.record_text.clone()) {
            Ok(raw) => RecordedPipeline::Rendered(raw),
            Err(_) => RecordedPipeline::Read((**self.value()).clone()),
        }
    }
}

/// Shows the value (decoding it): a plan read from the cache prints as the plan it was compiled to.
impl std::fmt::Debug for ResolvedPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedPipeline").field("value", self.value()).field("tracking", &self.tracking).finish()
    }
}

impl std::ops::Deref for ResolvedPipeline {
    type Target = Value;

    fn deref(&self) -> &Value {
        self.value()
    }
}

/// The resolved pipeline in a run record: rendered text when a run writes the record, the value
/// when a record is read back (already redacted; written again as it is).
#[derive(Debug, Clone)]
pub enum RecordedPipeline {
    Rendered(Box<RawValue>),
    Read(Value),
}

impl Serialize for RecordedPipeline {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RecordedPipeline::Rendered(raw) => raw.serialize(s),
            RecordedPipeline::Read(v) => Redacted(v).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for RecordedPipeline {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(RecordedPipeline::Read)
    }
}

fn as_bytes<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

fn from_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Bytes;
    impl<'de> serde::de::Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }
    d.deserialize_bytes(Bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_holds_the_redacted_pipeline_laid_out_as_a_pretty_record() {
        let v = serde_json::json!({"seed": 3, "params": {"api_key": "k-1", "lr": 0.1, "x": [1.0000000000000002, "a\nb"]}});
        let cached: ResolvedPipeline = rmp_serde::from_slice(&rmp_serde::to_vec_named(&ResolvedPipeline::new(v.clone())).unwrap()).unwrap();
        assert_eq!(**cached.value(), v, "the value survives the plan cache bit for bit");
        #[derive(Serialize)]
        struct Record {
            run: u32,
            resolved: RecordedPipeline,
        }
        let written = serde_json::to_string_pretty(&Record { run: 1, resolved: cached.for_record() }).unwrap();
        // Serialised in place as a struct field too: a `json!` map would order the keys as
        // serde_json's features say, which differ between `-p rao-pipeline` and the workspace.
        #[derive(Serialize)]
        struct InPlace<'a> {
            run: u32,
            resolved: Redacted<'a>,
        }
        let expected = serde_json::to_string_pretty(&InPlace { run: 1, resolved: Redacted(&v) }).unwrap();
        assert_eq!(written, expected, "the same bytes as serialising the redacted value in place");
        let back: Value = serde_json::from_str(&written).unwrap();
        assert_eq!(back["resolved"]["params"]["api_key"], "<redacted>");
    }
}
