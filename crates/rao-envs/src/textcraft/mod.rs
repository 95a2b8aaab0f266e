//! TextCraft: crafting tasks that decompose into parallel sub-tasks (ENVIRONMENTS.md §1).

pub mod craft;
pub mod episode;
pub mod expert;
pub mod expert_original;
pub mod grammar;
pub mod original;
pub mod plan;
pub mod tasks;
pub mod world;

pub use episode::{Action, Lang, TextCraftEpisode, verify_goal};
pub use expert::{ExpertConfig, expert_action};
pub use tasks::{Task, is_solvable, synthesize, synthesize_tiers};
pub use world::{Band, Bands, GoalCheck, Item, ItemId, ItemNames, Recipe, Rules, SynthConfig, World, generate};
