//! `rao results`: rewrite the generated tables of a document (RESULTS.md) from the store, after
//! running what they are missing (`--run`), or check that they are what the store gives.

use clap::Parser;
use rao_results::doc_blocks::{self, Block};

use super::compare::{CompareArgs, CompareFormat, Gathered, gather};
use super::*;

#[derive(clap::Args)]
pub struct ResultsArgs {
    /// Documents holding `<!-- rao compare ARGS -->` … `<!-- end rao compare -->` blocks; pipeline
    /// files in ARGS are relative to the document's folder.
    #[arg(default_value = "RESULTS.md")]
    pub documents: Vec<PathBuf>,
    /// First run (`rao run`) every pipeline and seed a block needs and the store lacks.
    #[arg(long)]
    pub run: bool,
    /// Write nothing: exit 1 if a table differs from what the store gives, or lacks runs.
    #[arg(long, conflicts_with = "run")]
    pub check: bool,
}

/// A block's arguments, read as `rao compare` reads its own.
#[derive(Parser)]
#[command(name = "rao compare")]
struct CompareLine {
    #[command(flatten)]
    args: CompareArgs,
}

/// What became of one block.
enum Outcome {
    Same,
    Changed(String),
    /// Runs are missing: the block is left as it is (a table of fewer seeds would replace the
    /// measured one).
    Incomplete(Vec<String>),
}

pub async fn results(args: ResultsArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let mut behind = 0;
    for doc in &args.documents {
        behind += document(doc, &args, &registry).await?;
    }
    Ok(if behind == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// One document: returns how many of its blocks are not what the store gives (changed under
/// `--check`, or lacking runs).
async fn document(doc: &std::path::Path, args: &ResultsArgs, registry: &Registry) -> anyhow::Result<usize> {
    let text = std::fs::read_to_string(doc).map_err(|e| anyhow::anyhow!("{}: {e}", doc.display()))?;
    let blocks = doc_blocks::blocks(&text).map_err(|e| anyhow::anyhow!("{}:{}: {}", doc.display(), e.line, e.message))?;
    if blocks.is_empty() {
        anyhow::bail!("{}: no `{}ARGS -->` block: nothing to regenerate", doc.display(), doc_blocks::OPEN);
    }
    let base = doc.parent().unwrap_or(std::path::Path::new(""));
    let mut bodies = Vec::new();
    let mut behind = 0;
    for block in &blocks {
        let at = format!("{}:{}", doc.display(), block.line);
        let outcome = regenerate(block, &text, base, args.run, registry).await.map_err(|e| anyhow::anyhow!("{at}: {e:#}"))?;
        bodies.push(match outcome {
            Outcome::Same => None,
            Outcome::Changed(body) => {
                if args.check {
                    eprintln!("{at}: the table differs from what the store gives (`rao results {}` rewrites it)", doc.display());
                    behind += 1;
                }
                Some(body)
            }
            Outcome::Incomplete(commands) => {
                eprintln!(
                    "{at}: left as it is: {} run{} not in the store (`rao results --run {}` runs them):",
                    commands.len(),
                    if commands.len() == 1 { " is" } else { "s are" },
                    doc.display()
                );
                for c in &commands {
                    eprintln!("  {c}");
                }
                behind += 1;
                None
            }
        });
    }
    let changed = bodies.iter().filter(|b| b.is_some()).count();
    if !args.check && changed > 0 {
        // `--run` can take hours: an edit made meanwhile is kept, not overwritten (the runs are
        // in the store, so running again only rewrites the tables).
        if std::fs::read_to_string(doc).ok().as_deref() != Some(text.as_str()) {
            anyhow::bail!("{}: changed while its tables were computed; nothing written: run `rao results` again", doc.display());
        }
        write_atomically(doc, &doc_blocks::splice(&text, &blocks, &bodies))?;
    }
    let verb = if args.check { "would change" } else { "rewritten" };
    eprintln!("{}: {} block{}, {changed} {verb}", doc.display(), blocks.len(), if blocks.len() == 1 { "" } else { "s" });
    Ok(behind)
}

async fn regenerate(block: &Block, text: &str, base: &std::path::Path, run: bool, registry: &Registry) -> anyhow::Result<Outcome> {
    let line = CompareLine::try_parse_from(std::iter::once("rao compare".to_string()).chain(block.args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("`{}`: {}", block.command(), e.render().to_string().trim_end()))?;
    if !matches!(line.args.format, CompareFormat::Markdown) {
        anyhow::bail!("`{}`: a document's table is Markdown: leave out --format", block.command());
    }
    let mut found = gather(&line.args, base, registry).await?;
    if run && !found.comparison.missing.is_empty() {
        run_missing(&found)?;
        found = gather(&line.args, base, registry).await?;
    }
    if !found.comparison.missing.is_empty() {
        return Ok(Outcome::Incomplete(found.comparison.missing.iter().map(|m| m.command.clone()).collect()));
    }
    let table = rao_results::compare_out::markdown(&found.comparison, line.args.columns.layout(line.args.every), line.args.brief);
    let body = doc_blocks::body(&table);
    Ok(if text[block.body.clone()] == body { Outcome::Same } else { Outcome::Changed(body) })
}

/// `rao run` for each pipeline and seed the comparison lacks, one after another, as separate
/// processes (each its own run, with its own record and progress).
fn run_missing(found: &Gathered) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let total = found.comparison.missing.len();
    for (i, m) in found.comparison.missing.iter().enumerate() {
        let p = found.pipeline_of(m).ok_or_else(|| anyhow::anyhow!("no pipeline for {} seed {}", m.pipeline, m.seed))?;
        eprintln!("rao results: {} of {total}: {}", i + 1, m.command);
        let mut command = std::process::Command::new(&exe);
        command.arg("run").arg(&p.pipeline);
        for o in &p.set {
            command.arg("--set").arg(o);
        }
        if let Some(s) = &p.store {
            command.arg("--store").arg(s);
        }
        let status = command.status()?;
        if !status.success() {
            anyhow::bail!("`{}` failed ({status}); the tables are left as they are", m.command);
        }
    }
    Ok(())
}

/// Replace `path` whole or not at all: a kill mid-write leaves the old document.
fn write_atomically(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    // The document keeps its permissions (a new temporary file is private to its owner).
    std::fs::set_permissions(tmp.path(), std::fs::metadata(path)?.permissions())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.error))?;
    Ok(())
}
