//! What loading the original TextCraft files did: recipes by type (kept and skipped), tags,
//! tasks loaded and skipped, duplicate ids, gold trajectories checked, and every problem located
//! in the user's file.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// Something wrong in a user's file: where (`file:line:column`) and what to fix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl Problem {
    pub fn at(file: &str, line: usize, column: Option<usize>, message: String) -> Self {
        Problem { file: file.to_string(), line: Some(line), column, message }
    }
    pub fn file(file: &str, message: String) -> Self {
        Problem { file: file.to_string(), line: None, column: None, message }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GoldSummary {
    /// Tasks that came with a gold trajectory.
    pub with_gold: usize,
    /// Of those, gold trajectories that reach every target under the original's craft rule.
    pub reaching_success: usize,
    /// The others: where each one fails.
    pub failures: Vec<Problem>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadReport {
    pub recipe_files: usize,
    /// Crafting recipes loaded, by type.
    pub crafting_recipes: BTreeMap<String, usize>,
    /// Files skipped because they are not crafting recipes (smelting, stonecutting, special), by type.
    pub skipped_by_type: BTreeMap<String, usize>,
    /// Crafting recipe files that could not be read (each one is also a problem).
    pub malformed_recipes: usize,
    /// Recipe files with ingredients the original drops (lists of alternatives).
    pub dropped_ingredients: Vec<String>,
    /// Recipe files that take no ingredient at all once those are dropped.
    pub free_recipes: Vec<String>,
    /// Each tag and how many items satisfy it.
    pub tags: BTreeMap<String, usize>,
    /// Items that only crafting loops make (lapis lazuli from its block, which is made of lapis
    /// lazuli): counted as given (tier 0).
    pub items_on_loops: Vec<String>,
    /// Non-blank lines of the task file.
    pub task_lines: usize,
    pub tasks_loaded: usize,
    pub tasks_skipped: usize,
    /// Ids given to several tasks, with their lines (each such task is known as `id@line`).
    pub duplicate_ids: BTreeMap<String, Vec<usize>>,
    pub gold: GoldSummary,
    /// Bad recipe files, bad task lines and tasks that cannot be done: what `strict` refuses.
    pub problems: Vec<Problem>,
}

impl LoadReport {
    /// A few lines for people: what was kept and skipped, then every problem.
    pub fn summary(&self) -> Vec<String> {
        let join = |m: &BTreeMap<String, usize>| m.iter().map(|(k, n)| format!("{n} {k}")).collect::<Vec<_>>().join(", ");
        let mut out = vec![format!(
            "recipes: {} files, {} loaded ({}), {} skipped as not crafting ({}), {} unreadable",
            self.recipe_files,
            self.crafting_recipes.values().sum::<usize>(),
            join(&self.crafting_recipes),
            self.skipped_by_type.values().sum::<usize>(),
            join(&self.skipped_by_type),
            self.malformed_recipes
        )];
        if !self.dropped_ingredients.is_empty() {
            out.push(format!(
                "{} recipe files have ingredients given as lists of alternatives; as in the original, those ingredients are not required: {}",
                self.dropped_ingredients.len(),
                self.dropped_ingredients.join(", ")
            ));
        }
        let empty: Vec<&str> = self.tags.iter().filter(|(_, n)| **n == 0).map(|(t, _)| t.as_str()).collect();
        out.push(match empty.len() {
            0 => format!("tags: {}, each satisfied by some item", self.tags.len()),
            k => format!(
                "tags: {}; {k} satisfied by no item (recipes that need them cannot be crafted): {}",
                self.tags.len(),
                empty.join(", ")
            ),
        });
        out.push(format!("tasks: {} loaded, {} skipped of {} lines", self.tasks_loaded, self.tasks_skipped, self.task_lines));
        for (id, lines) in &self.duplicate_ids {
            out.push(format!(
                "id `{id}` is on lines {}; those tasks are kept as {}",
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", "),
                lines.iter().map(|l| format!("`{id}@{l}`")).collect::<Vec<_>>().join(", ")
            ));
        }
        if self.gold.with_gold > 0 {
            out.push(format!("gold trajectories: {} of {} reach every target", self.gold.reaching_success, self.gold.with_gold));
            out.extend(self.gold.failures.iter().map(|p| format!("  {p}")));
        }
        out.extend(self.problems.iter().map(|p| p.to_string()));
        out
    }
}
