//! The engine serves the checkpoint's own version, or the stage fails saying so.
//!
//! A checkpoint of LoRA adapters travels to every engine as a PEFT adapter directory, loaded
//! under a name that carries its version and content (`MODEL-v7-3f9a…`: the update count and
//! the first 12 hex digits of the adapter's blake3), so a request names exactly the weights it
//! wants; adapters of older versions of the same model are unloaded. The engine's answer must
//! come from that name: an engine that does not serve it (no runtime LoRA loading, an adapter
//! it cannot load, an answer from another model) is an error, never a silent rollout of the
//! base model. A checkpoint trained in full (no adapters) cannot travel this way: the engine
//! serves the base model's files, so it is refused; export it (`hf_export`) and serve that
//! directory instead.

use std::path::{Path, PathBuf};

use rao_policy::Policy;
use serde_json::{Value, json};

use crate::chat_api::server_says;

/// What requests name as their model, and the adapter directory behind it (if any).
#[derive(Debug, Clone)]
pub struct ServedVersion {
    pub model: String,
    pub adapter: Option<PathBuf>,
}

/// `MODEL-vVERSION-HASH`: the name an adapter version is served under.
pub fn adapter_name(base: &str, version: i32, hash: &str) -> String {
    format!("{base}-v{version}-{hash}")
}

/// The version of an adapter name of `base` (`None`: not one of rao's names for it).
fn version_of(base: &str, name: &str) -> Option<i32> {
    let rest = name.strip_prefix(base)?.strip_prefix("-v")?;
    let (version, hash) = rest.split_once('-')?;
    (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
    version.parse().ok()
}

/// Makes every server in `urls` serve `policy`'s version: the base model's name for an
/// untrained checkpoint without adapters, its adapters (written under `adapter_root`) otherwise.
pub async fn serve(
    client: &reqwest::Client,
    urls: &[String],
    base: &str,
    policy: &Policy,
    adapter_root: &Path,
) -> anyhow::Result<ServedVersion> {
    if policy.lora.is_none() {
        anyhow::ensure!(
            policy.version == 0,
            "the checkpoint (version {}) was trained in full, without LoRA adapters; the engine serves the base model's files, \
             not these weights. Export it (`kind: hf_export`) and serve that directory as the engine's model, or train LoRA adapters \
             (`hf_model` with `lora`)",
            policy.version
        );
        return Ok(ServedVersion { model: base.to_string(), adapter: None });
    }
    let (name, dir) = write_adapter(policy, base, adapter_root)?;
    for url in urls {
        load(client, url, &name, &dir).await?;
        unload_older(client, url, base, policy.version, &name).await;
    }
    Ok(ServedVersion { model: name, adapter: Some(dir) })
}

/// The adapter as a PEFT directory `adapter_root/NAME` (written once: the name is its content).
fn write_adapter(policy: &Policy, base: &str, adapter_root: &Path) -> anyhow::Result<(String, PathBuf)> {
    std::fs::create_dir_all(adapter_root).map_err(|e| anyhow::anyhow!("{}: {e}", adapter_root.display()))?;
    let staging = tempfile::tempdir_in(adapter_root)?;
    policy.export_peft(base, staging.path())?;
    let mut hasher = blake3::Hasher::new();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        hasher.update(&std::fs::read(staging.path().join(file))?);
    }
    let name = adapter_name(base, policy.version, &hasher.finalize().to_hex()[..12]);
    let dir = adapter_root.join(&name);
    if !dir.join("adapter_model.safetensors").exists() {
        // Another stage may have written the same version meanwhile: same bytes, either wins.
        let _ = std::fs::rename(staging.keep(), &dir);
    }
    anyhow::ensure!(dir.join("adapter_model.safetensors").exists(), "{}: the adapter was not written", dir.display());
    Ok((name, dir))
}

/// Loads adapter `name` from `dir` into the server at `url` (a name it already has is fine: the
/// name is the content).
pub async fn load(client: &reqwest::Client, url: &str, name: &str, dir: &Path) -> anyhow::Result<()> {
    let endpoint = format!("{}/load_lora_adapter", url.trim_end_matches('/'));
    let body = json!({"lora_name": name, "lora_path": dir.display().to_string()});
    let resp = match client.post(&endpoint).json(&body).send().await {
        Ok(resp) => resp,
        Err(e) => {
            // An engine rao started that has died or hung is named, with the cause in its log
            // (off the async workers: it may wait for a dying engine to exit).
            let urls = vec![url.to_string()];
            let gone = tokio::task::spawn_blocking(move || crate::engine_launch::exited(&urls)).await.unwrap_or_default();
            let gone: String = gone.iter().map(|g| format!("; {g}")).collect();
            anyhow::bail!("{endpoint}: {e}{gone}")
        }
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let says = server_says(resp).await;
    if status.as_u16() == 400 && says.contains("already") {
        return Ok(());
    }
    if status.as_u16() == 404 && !says.contains(name) {
        anyhow::bail!(
            "the engine at {url} does not load adapters while serving, so it cannot serve version `{name}` (HTTP 404{says}): \
             start it with `--enable-lora --max-lora-rank R` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
        );
    }
    anyhow::bail!("the engine at {url} refused adapter version `{name}` from {}: HTTP {status}{says}", dir.display())
}

/// Unloads adapters of `base` older than `version` (best effort: one still in use by another
/// stage is loaded again by it on demand).
async fn unload_older(client: &reqwest::Client, url: &str, base: &str, version: i32, keep: &str) {
    let url = url.trim_end_matches('/');
    let Ok(resp) = client.get(format!("{url}/models")).send().await else { return };
    let Ok(models) = resp.json::<Value>().await else { return };
    let names = models["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str());
    for old in names.filter(|n| *n != keep && version_of(base, n).is_some_and(|v| v < version)) {
        let _ = client.post(format!("{url}/unload_lora_adapter")).json(&json!({"lora_name": old})).send().await;
    }
}

/// Whether an engine's refusal says it does not know the model asked for (an adapter unloaded
/// since, or never loaded).
pub fn is_unknown_model(status: u16, says: &str) -> bool {
    status == 404 && says.contains("does not exist")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_names_carry_their_version_and_only_rao_names_parse() {
        let name = adapter_name("tiny", 7, "0123456789ab");
        assert_eq!(name, "tiny-v7-0123456789ab");
        assert_eq!(version_of("tiny", &name), Some(7));
        assert_eq!(version_of("tiny", "tiny"), None);
        assert_eq!(version_of("tiny", "tiny-v7-0123"), None);
        assert_eq!(version_of("tiny", "other-v7-0123456789ab"), None);
        assert_eq!(version_of("tiny", "tiny-vx-0123456789ab"), None);
    }
}
