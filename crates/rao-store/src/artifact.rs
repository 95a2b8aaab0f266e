//! A finished output as a consumer sees it: which instance and attempt made it, and its files.

use serde_json::Value;

use crate::layout::output_prefix;
use crate::manifest::FileEntry;

/// One upstream artifact handed to a stage: an output of a finished instance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InputArtifact {
    pub instance: String,
    pub fingerprint: String,
    /// The producer's attempt directory (see `Manifest::attempt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
    pub output: String,
    pub files: Vec<FileEntry>,
    /// The producing instance's params (e.g. a `dataset`'s `url`), so that a stage can name the
    /// user's source in its messages rather than the store's copy.
    pub params: Value,
}

impl InputArtifact {
    /// Store key prefix of this artifact.
    pub fn prefix(&self) -> String {
        output_prefix(&self.fingerprint, self.attempt.as_deref(), &self.output)
    }

    /// Store key of one of this artifact's files.
    pub fn key(&self, path: &str) -> String {
        format!("{}/{}", self.prefix(), path)
    }
}
