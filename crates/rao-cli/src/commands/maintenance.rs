//! `rao verify` and `rao gc`: the store's health.

use super::*;

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// A pipeline file whose store to check (or give --store).
    pub pipeline: Option<PathBuf>,
    /// The store to check (path, file://, s3://, gs://, az://).
    #[arg(long)]
    pub store: Option<String>,
    /// Set damaged manifests aside (their instances run again on the next run).
    #[arg(long)]
    pub repair: bool,
    /// The report as JSON (counts and every damaged object with why).
    #[arg(long)]
    pub json: bool,
}

pub async fn verify(args: VerifyArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let VerifyArgs { pipeline, store, repair, json } = args;
    let store = maintenance_store(&store, pipeline.as_ref(), &registry, !repair)?;
    let report = rao_pipeline::maintenance::verify(&store, repair).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for d in &report.damaged {
            println!("DAMAGED {} ({}): {}", d.fingerprint, d.instance.as_deref().unwrap_or("?"), d.why);
        }
        println!(
            "{}: {} manifests, {} files, {} bytes checked; {} damaged{}",
            store.url(),
            report.manifests,
            report.files,
            report.bytes,
            report.damaged.len(),
            if repair { format!(", {} set aside (they run again next time)", report.quarantined) } else { String::new() }
        );
    }
    if !report.damaged.is_empty() && !repair {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct GcArgs {
    /// Pipelines whose artifacts to keep (their current fingerprints, under the --set values
    /// given, and what their newest runs used: see --keep-runs). None: keep every finished
    /// artifact and remove only leftovers.
    pub pipelines: Vec<PathBuf>,
    /// Overrides the pipelines are compiled with, as for `rao run` (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// `latest`: also keep what the newest run of each pipeline used under each list of
    /// `--set` values it was run with (`--set seed=2`, …), and the newest that succeeded;
    /// `none`: keep only what the files reference under the --set values given here.
    #[arg(long, value_enum, default_value = "latest")]
    pub keep_runs: KeepRuns,
    /// The store to clean (default: the first pipeline's).
    #[arg(long)]
    pub store: Option<String>,
    /// Really delete (default: only list what would go).
    #[arg(long)]
    pub delete: bool,
    /// Leave whatever was written less than this long ago (a run elsewhere may be publishing
    /// it, or using it under `--set` overrides these files do not show): `30m`, `2h`, `0`.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_min_age)]
    pub min_age: std::time::Duration,
    /// The report as JSON (what was or would be removed, bytes, the error that stopped it).
    #[arg(long)]
    pub json: bool,
}

pub async fn gc(args: GcArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let GcArgs { pipelines, sets, keep_runs, store, delete, min_age, json } = args;
    let store = maintenance_store(&store, pipelines.first(), &registry, !delete)?;
    let keep = if pipelines.is_empty() {
        None
    } else {
        let mut keep = Some(std::collections::BTreeSet::new());
        for p in &pipelines {
            let c = rao_pipeline::load(p, &sets, &registry).map_err(|d| anyhow::anyhow!("{d}"))?;
            let snap = rao_pipeline::snapshot::snapshot(&c, &store).await?;
            // What a pipeline references is only known in full once its loops have
            // decided; until then nothing finished goes.
            if let Some(name) = snap.undetermined(&c) {
                eprintln!(
                    "note: {}: `{name}` waits on a loop that has not decided (run the pipeline first); \
                     every finished object is kept, only leftovers go",
                    p.display()
                );
                keep = None;
            }
            let newest = match keep_runs {
                KeepRuns::Latest => Some(rao_pipeline::run_record::newest_runs_fingerprints(&store, &c.name).await?),
                KeepRuns::None => None,
            };
            if let Some(key) = newest.as_ref().and_then(|n| n.unreadable.as_ref()) {
                eprintln!(
                    "note: {}: run record `{key}` cannot be read, so what its run used is unknown; \
                     every finished object is kept, only leftovers go",
                    p.display()
                );
                keep = None;
            }
            if let Some(k) = keep.as_mut() {
                k.extend(snap.fps.into_iter().flatten());
                if let Some(newest) = newest {
                    k.extend(newest.fingerprints);
                    let other_sets = newest.with_overrides;
                    if !other_sets.is_empty() {
                        let listed: Vec<String> = other_sets.iter().map(|o| o.join(" ")).collect();
                        eprintln!(
                            "note: {}: also kept what its newest runs under other --set values used ({}); `--keep-runs none` keeps only what the file names",
                            p.display(),
                            listed.join("; ")
                        );
                    }
                }
            }
        }
        keep
    };
    let report = rao_pipeline::maintenance::gc(&store, keep.as_ref(), delete, min_age).await;
    let verb = if delete { "removed" } else { "would remove" };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in &report.removed {
            println!("{verb} {r}");
        }
        println!(
            "{verb} {} objects or prefixes, {} bytes{}",
            report.removed.len(),
            report.bytes,
            if delete { "" } else { " (dry run: pass --delete)" }
        );
    }
    if let Some(e) = &report.stopped_by {
        // A store error, like every other command's: exit 2, after the report of what went.
        eprintln!(
            "error: gc stopped part way: {e}\n  what the report lists {}; the rest was not looked at. \
             Run it again once the store answers.",
            if delete { "was removed" } else { "would go" }
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// `rao gc --keep-runs`.
#[derive(Copy, Clone, ValueEnum)]
pub enum KeepRuns {
    Latest,
    None,
}

/// `rao gc --min-age`: a duration as pipeline files write them, or `0`.
fn parse_min_age(text: &str) -> Result<std::time::Duration, String> {
    if text.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()).trim().parse::<f64>() == Ok(0.0) {
        return Ok(std::time::Duration::ZERO);
    }
    rao_plan::spec::Duration::parse(text).map(|d| d.0)
}
