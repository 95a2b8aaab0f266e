//! TextCraft: crafting tasks that decompose into parallel sub-tasks (ENVIRONMENTS.md §1).

pub mod episode;
pub mod expert;
pub mod grammar;
pub mod minecraft;
pub mod tasks;
pub mod world;

pub use episode::{Action, Lang, TextCraftEpisode, verify_goal};
pub use expert::{ExpertConfig, expert_action};
pub use tasks::{Task, is_solvable, synthesize, synthesize_tiers};
pub use world::{Band, Bands, Item, ItemId, Recipe, SynthConfig, World, generate};
