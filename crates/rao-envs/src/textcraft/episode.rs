//! The TextCraft action language over a shared inventory.
//!
//! Actions: `info ITEM`, `craft ITEM [N]`, `inv`, `finish`, and in recursive mode
//! `spawn ITEM [N] (, ITEM [N])*`. Counts of 1 are not written. Observations start with `<obs>`.
//! Worlds read from the original TextCraft files also take the original's craft,
//! `craft ITEM N from ING a (, ING a)*`: N is the total to make and the ingredients are exact.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::craft::{self, CraftError};
use super::tasks::Task;
use super::world::{GoalCheck, ItemId, MAX_DEPTH_TOKEN, Rules, World};
use crate::env::{Episode, Refusal, Step, StepOutput};
use crate::vocab::{BOS, OBS, Tok, Vocab};

/// A parsed action.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Info(ItemId),
    Craft(ItemId, u64),
    /// The original's craft: item, total units to make, exact ingredients (concrete items).
    CraftFrom(ItemId, u64, Vec<(ItemId, u64)>),
    Inv,
    Finish,
    Spawn(Vec<(ItemId, u64)>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ParseError {
    Syntax,
    UnknownItem,
}

/// Token helpers bound to a world's vocabulary.
pub struct Lang<'w> {
    pub world: &'w World,
}

impl<'w> Lang<'w> {
    pub fn new(world: &'w World) -> Self {
        Lang { world }
    }
    fn v(&self) -> &Vocab {
        &self.world.vocab
    }
    fn t(&self, w: &str) -> Tok {
        self.v().id(w)
    }

    /// `ITEM [N]` tokens (the count only when it is not 1).
    pub fn item_count(&self, item: ItemId, n: u64) -> Vec<Tok> {
        let mut out = self.world.item(item).tokens.clone();
        if n != 1 {
            out.extend(self.v().number(n));
        }
        out
    }

    pub fn encode(&self, a: &Action) -> Vec<Tok> {
        match a {
            Action::Info(i) => [vec![self.t("info")], self.world.item(*i).tokens.clone()].concat(),
            Action::Craft(i, n) => [vec![self.t("craft")], self.item_count(*i, *n)].concat(),
            Action::CraftFrom(i, n, ings) => {
                let mut out = [vec![self.t("craft")], self.item_count(*i, *n), vec![self.t("from")]].concat();
                out.extend(self.list(ings));
                out
            }
            Action::Inv => vec![self.t("inv")],
            Action::Finish => vec![self.t("finish")],
            Action::Spawn(goals) => [vec![self.t("spawn")], self.list(goals)].concat(),
        }
    }

    /// `ITEM [N] , ITEM [N] …`
    pub fn list(&self, pairs: &[(ItemId, u64)]) -> Vec<Tok> {
        let mut out = Vec::new();
        for (k, (i, n)) in pairs.iter().enumerate() {
            if k > 0 {
                out.push(self.t(","));
            }
            out.extend(self.item_count(*i, *n));
        }
        out
    }

    /// `ITEM [N] (, ITEM [N])*` filling `toks` exactly.
    pub fn parse_list(&self, toks: &[Tok]) -> Result<Vec<(ItemId, u64)>, ParseError> {
        let comma = self.t(",");
        let mut out = Vec::new();
        for part in toks.split(|t| *t == comma) {
            let (g, used) = self.parse_item_count(part)?;
            if used != part.len() {
                return Err(ParseError::Syntax);
            }
            out.push(g);
        }
        Ok(out)
    }

    /// Parse `ITEM [N]` at the start of `toks`; returns the pair and tokens used.
    pub fn parse_item_count(&self, toks: &[Tok]) -> Result<((ItemId, u64), usize), ParseError> {
        let (item, used) = self.world.parse_item(toks).ok_or(ParseError::UnknownItem)?;
        let mut n: u64 = 0;
        let mut k = used;
        while k < toks.len() {
            match self.v().digit_value(toks[k]) {
                Some(d) if n < 1_000_000 => {
                    n = n * 10 + d;
                    k += 1;
                }
                _ => break,
            }
        }
        if k == used {
            return Ok(((item, 1), used));
        }
        if n == 0 {
            return Err(ParseError::Syntax);
        }
        Ok(((item, n), k))
    }

    pub fn parse_goal(&self, goal: &[Tok]) -> Option<(ItemId, u64)> {
        match self.parse_item_count(goal) {
            Ok((g, used)) if used == goal.len() => Some(g),
            _ => None,
        }
    }

    /// A goal of one or more targets (`ITEM [N] , ITEM [N]`).
    pub fn parse_goals(&self, goal: &[Tok]) -> Option<Vec<(ItemId, u64)>> {
        self.parse_list(goal).ok()
    }

    pub fn parse(&self, toks: &[Tok]) -> Result<Action, ParseError> {
        let Some((&verb, rest)) = toks.split_first() else { return Err(ParseError::Syntax) };
        let word = self.v().word(verb);
        let whole = |r: Result<((ItemId, u64), usize), ParseError>| -> Result<(ItemId, u64), ParseError> {
            let (g, used) = r?;
            if used == rest.len() { Ok(g) } else { Err(ParseError::Syntax) }
        };
        match word {
            "info" => {
                let (item, used) = self.world.parse_item(rest).ok_or(ParseError::UnknownItem)?;
                if used == rest.len() { Ok(Action::Info(item)) } else { Err(ParseError::Syntax) }
            }
            "craft" => match self.v().get("from").and_then(|from| rest.iter().position(|t| *t == from)) {
                Some(at) => {
                    let (i, n) = match self.parse_item_count(&rest[..at])? {
                        (g, used) if used == at => g,
                        _ => return Err(ParseError::Syntax),
                    };
                    // Nothing after `from`: a recipe that takes nothing (possible once the
                    // original drops an ingredient given as alternatives).
                    let ings = if at + 1 == rest.len() { Vec::new() } else { self.parse_list(&rest[at + 1..])? };
                    Ok(Action::CraftFrom(i, n, ings))
                }
                None => whole(self.parse_item_count(rest)).map(|(i, n)| Action::Craft(i, n)),
            },
            "inv" if rest.is_empty() => Ok(Action::Inv),
            "finish" if rest.is_empty() => Ok(Action::Finish),
            "spawn" => self.parse_list(rest).map(Action::Spawn),
            _ => Err(ParseError::Syntax),
        }
    }

    fn obs(&self, words: &[&str]) -> Vec<Tok> {
        std::iter::once(OBS).chain(words.iter().map(|w| self.t(w))).collect()
    }

    /// `<obs> [x R] ING [a] ... [have H]` or `<obs> base [have H]`. Worlds of the original
    /// TextCraft list every recipe, separated by `or`; a tag lists the items that satisfy it.
    pub fn info_obs(&self, item: ItemId, held: u64) -> Vec<Tok> {
        let it = self.world.item(item);
        let mut out = vec![OBS];
        let shown = if self.world.rules == Rules::Original { it.recipes.len() } else { 1 };
        if it.is_tag() {
            let members: Vec<(ItemId, u64)> = it.members.iter().map(|&m| (m, 1)).collect();
            out.extend(self.list(&members));
        } else if it.recipes.is_empty() {
            out.push(self.t("base"));
        }
        for (k, r) in it.recipes.iter().take(shown).enumerate() {
            if k > 0 {
                out.push(self.t("or"));
            }
            if r.result_count != 1 {
                out.push(self.t("x"));
                out.extend(self.v().number(r.result_count as u64));
            }
            for &(ing, a) in &r.ingredients {
                out.extend(self.item_count(ing, a as u64));
            }
        }
        if held > 0 {
            out.push(self.t("have"));
            out.extend(self.v().number(held));
        }
        out
    }
}

/// One tree's episode: a task and the inventory all its nodes share.
pub struct TextCraftEpisode {
    pub world: Arc<World>,
    pub task: Task,
    inventory: Mutex<HashMap<ItemId, u64>>,
}

impl TextCraftEpisode {
    pub fn new(world: Arc<World>, task: Task) -> Self {
        let inventory = Mutex::new(task.inventory_map());
        TextCraftEpisode { world, task, inventory }
    }

    pub fn held(&self, item: ItemId) -> u64 {
        self.inventory.lock().get(&item).copied().unwrap_or(0)
    }

    fn lang(&self) -> Lang<'_> {
        Lang::new(&self.world)
    }

    /// `craft ITEM N` (compact) or, with exact ingredients, the original's craft.
    fn craft(&self, item: ItemId, n: u64, exact: Option<&[(ItemId, u64)]>) -> StepOutput {
        let lang = self.lang();
        let made = {
            let mut inv = self.inventory.lock();
            match exact {
                None => craft::compact(&self.world, &mut inv, item, n),
                Some(ings) => craft::exact(&self.world, &mut inv, item, n, ings),
            }
        };
        match made {
            Ok(made) => StepOutput {
                step: Step::Observe(lang.obs(&["ok"])),
                counters: vec![(self.world.item(item).name.clone(), made as i64)],
                result: None,
            },
            Err(CraftError::NoRecipe) => StepOutput::observe(lang.obs(&["err", "base"])),
            Err(CraftError::NoMatch) => StepOutput::observe(lang.obs(&["err", "recipe"])),
            Err(CraftError::Need(ing, short)) => {
                let mut obs = lang.obs(&["err", "need"]);
                obs.extend(lang.item_count(ing, short));
                StepOutput::observe(obs)
            }
        }
    }

    /// What the inventory holds of each goal item, as a node's result when it finishes (the
    /// original TextCraft judges a goal by it).
    fn held_result(&self, goal: &[Tok]) -> Option<String> {
        let goals = self.lang().parse_goals(goal)?;
        let held: BTreeMap<String, u64> = goals.iter().map(|&(i, _)| (self.world.item(i).name.clone(), self.held(i))).collect();
        serde_json::to_string(&HeldAtFinish { held }).ok()
    }
}

/// A node's result in worlds of the original TextCraft: units of its goal items held at finish.
#[derive(serde::Serialize, serde::Deserialize)]
struct HeldAtFinish {
    held: BTreeMap<String, u64>,
}

impl Episode for TextCraftEpisode {
    fn vocab(&self) -> &Vocab {
        &self.world.vocab
    }

    fn root_goal(&self) -> Vec<Tok> {
        self.lang().list(&self.task.target_units())
    }

    fn prompt(&self, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok> {
        let v = &self.world.vocab;
        let mode = v.id(if recursive { "<rec>" } else { "<flat>" });
        let d = v.id(&format!("@{}", depth.min(MAX_DEPTH_TOKEN)));
        [vec![BOS, mode, d], goal.to_vec()].concat()
    }

    fn view(&self, ctx: &[Tok]) -> Option<crate::node::NodeView> {
        super::expert::parse_context(&self.world, ctx)
    }

    fn instructions(&self, recursive: bool) -> String {
        let exact = if self.world.rules == Rules::Original {
            "- `craft ITEM N from ING A , ING A`: the exact recipe: N units of ITEM from exactly these ingredients \
             (A units each; a recipe that names a tag takes any one of its members).\n"
        } else {
            ""
        };
        let launch = "`spawn ITEM [N] , ITEM [N]` launches one sub-agent per item to make it (in the shared \
                      inventory); each reports `ok` (made) or `fail`.";
        format!(
            "You craft items in TextCraft. An item is named by its words (e.g. `M t3 i8`); a count follows a name \
             (no count means 1). Your goal names the items to make. Every agent of this task shares one inventory.\n\
             Actions:\n\
             - `info ITEM`: its recipes: `x N` when one craft makes N units, then the ingredients with counts, `or` \
             between recipes; `base` for an item nobody crafts; `have N` for the units held.\n\
             - `craft ITEM [N]`: make N units from ingredients in the inventory: `ok`, or `err need ITEM N` for what is short.\n\
             {exact}\
             - `inv`: what the inventory holds.\n\
             - `finish`: you are done; you succeed if your goal's units were made.\n\
             {}\n{}",
            crate::text::recursion_help(recursive, launch),
            crate::text::REPLY_FORMAT
        )
    }

    fn step(&self, goal: &[Tok], action: &[Tok], recursive: bool) -> StepOutput {
        let lang = self.lang();
        let parsed = match lang.parse(action) {
            Ok(a) => a,
            Err(ParseError::Syntax) => return StepOutput::observe(lang.obs(&["err", "syntax"])),
            Err(ParseError::UnknownItem) => return StepOutput::observe(lang.obs(&["err", "unknown"])),
        };
        match parsed {
            Action::Info(i) => StepOutput::observe(lang.info_obs(i, self.held(i))),
            Action::Craft(i, n) => self.craft(i, n, None),
            Action::CraftFrom(i, n, ings) => self.craft(i, n, Some(&ings)),
            Action::Inv => {
                let inv = self.inventory.lock();
                let mut held: Vec<(ItemId, u64)> = inv.iter().filter(|(_, n)| **n > 0).map(|(i, n)| (*i, *n)).collect();
                held.sort();
                if held.is_empty() {
                    return StepOutput::observe(lang.obs(&["empty"]));
                }
                let mut obs = vec![OBS];
                for (i, n) in held {
                    obs.extend(self.world.item(i).tokens.iter().copied());
                    obs.extend(self.world.vocab.number(n));
                }
                StepOutput::observe(obs)
            }
            Action::Finish => {
                let result = if self.world.rules == Rules::Original { self.held_result(goal) } else { None };
                StepOutput { step: Step::Finish, counters: vec![], result }
            }
            Action::Spawn(goals) => {
                if !recursive {
                    return StepOutput::observe(self.refusal(Refusal::NotRecursive));
                }
                let own = lang.parse_goal(goal);
                if goals.iter().any(|g| Some(*g) == own) {
                    return StepOutput::observe(self.refusal(Refusal::SelfSpawn));
                }
                StepOutput {
                    step: Step::Spawn(goals.iter().map(|&(i, n)| lang.item_count(i, n)).collect()),
                    counters: vec![],
                    result: None,
                }
            }
        }
    }

    fn receipt(&self, score: f64, _result: Option<&str>) -> Vec<Tok> {
        vec![self.world.vocab.id(if score >= 1.0 { "ok" } else { "fail" })]
    }

    fn refusal(&self, why: Refusal) -> Vec<Tok> {
        crate::node::refusal(&self.world.vocab, why)
    }

    /// 1 iff the node finished and every goal item is there: TextCraft-Synth counts the units
    /// its subtree crafted (not held-count deltas: siblings share the inventory and may
    /// legitimately consume each other's products while they run concurrently); the original
    /// TextCraft, as its authors' environment does, what the inventory held when it finished.
    fn verify(&self, goal: &[Tok], finished: bool, result: Option<&str>, subtree: &BTreeMap<String, i64>) -> f64 {
        verify_goal(&self.world, goal, finished, result, subtree)
    }
}

/// The TextCraft verifier as a pure function (the judge stage recomputes scores with it).
pub fn verify_goal(world: &World, goal: &[Tok], finished: bool, result: Option<&str>, subtree: &BTreeMap<String, i64>) -> f64 {
    let Some(goals) = Lang::new(world).parse_goals(goal) else { return 0.0 };
    if !finished {
        return 0.0;
    }
    let reached = |units: &dyn Fn(&str) -> i64| goals.iter().all(|&(item, n)| units(&world.item(item).name) >= n as i64);
    let ok = match world.rules {
        Rules::Synth => reached(&|name| subtree.get(name).copied().unwrap_or(0)),
        Rules::Original => match result.and_then(|r| serde_json::from_str::<HeldAtFinish>(r).ok()) {
            Some(h) => {
                reached(&|name| h.held.get(name).copied().unwrap_or(0) as i64)
                    && (world.goal_check == GoalCheck::Held || reached(&|name| subtree.get(name).copied().unwrap_or(0)))
            }
            None => false,
        },
    };
    if ok { 1.0 } else { 0.0 }
}
