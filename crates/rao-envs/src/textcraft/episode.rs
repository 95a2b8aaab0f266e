//! The TextCraft action language over a shared inventory.
//!
//! Actions: `info ITEM`, `craft ITEM [N]`, `inv`, `finish`, and in recursive mode
//! `spawn ITEM [N] (, ITEM [N])*`. Counts of 1 are not written. Observations start with `<obs>`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::tasks::Task;
use super::world::{ItemId, MAX_DEPTH_TOKEN, World};
use crate::env::{Episode, Refusal, Step, StepOutput};
use crate::vocab::{BOS, OBS, Tok, Vocab};

/// A parsed action.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Info(ItemId),
    Craft(ItemId, u64),
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
            Action::Inv => vec![self.t("inv")],
            Action::Finish => vec![self.t("finish")],
            Action::Spawn(goals) => {
                let mut out = vec![self.t("spawn")];
                for (k, (i, n)) in goals.iter().enumerate() {
                    if k > 0 {
                        out.push(self.t(","));
                    }
                    out.extend(self.item_count(*i, *n));
                }
                out
            }
        }
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
            "craft" => whole(self.parse_item_count(rest)).map(|(i, n)| Action::Craft(i, n)),
            "inv" if rest.is_empty() => Ok(Action::Inv),
            "finish" if rest.is_empty() => Ok(Action::Finish),
            "spawn" => {
                let comma = self.t(",");
                let mut goals = Vec::new();
                for part in rest.split(|t| *t == comma) {
                    let (g, used) = self.parse_item_count(part)?;
                    if used != part.len() {
                        return Err(ParseError::Syntax);
                    }
                    goals.push(g);
                }
                Ok(Action::Spawn(goals))
            }
            _ => Err(ParseError::Syntax),
        }
    }

    fn obs(&self, words: &[&str]) -> Vec<Tok> {
        std::iter::once(OBS).chain(words.iter().map(|w| self.t(w))).collect()
    }

    /// `<obs> [x R] ING [a] ... [have H]` or `<obs> base [have H]`.
    pub fn info_obs(&self, item: ItemId, held: u64) -> Vec<Tok> {
        let it = self.world.item(item);
        let mut out = vec![OBS];
        match it.recipes.first() {
            None => out.push(self.t("base")),
            Some(r) => {
                if r.result_count != 1 {
                    out.push(self.t("x"));
                    out.extend(self.v().number(r.result_count as u64));
                }
                for &(ing, a) in &r.ingredients {
                    out.extend(self.item_count(ing, a as u64));
                }
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
        self.inventory.lock().unwrap().get(&item).copied().unwrap_or(0)
    }

    fn lang(&self) -> Lang<'_> {
        Lang::new(&self.world)
    }

    fn craft(&self, item: ItemId, n: u64) -> StepOutput {
        let lang = self.lang();
        let it = self.world.item(item);
        if it.is_base() {
            return StepOutput::observe(lang.obs(&["err", "base"]));
        }
        let mut inv = self.inventory.lock().unwrap();
        // The first recipe the inventory can pay for; else report what the first one lacks.
        for r in &it.recipes {
            let crafts = n.div_ceil(r.result_count as u64);
            if r.ingredients.iter().all(|&(ing, a)| inv.get(&ing).copied().unwrap_or(0) >= crafts * a as u64) {
                for &(ing, a) in &r.ingredients {
                    *inv.get_mut(&ing).unwrap() -= crafts * a as u64;
                }
                let made = crafts * r.result_count as u64;
                *inv.entry(item).or_default() += made;
                return StepOutput { step: Step::Observe(lang.obs(&["ok"])), counters: vec![(it.name.clone(), made as i64)], result: None };
            }
        }
        let r = &it.recipes[0];
        let crafts = n.div_ceil(r.result_count as u64);
        let (ing, short) = r
            .ingredients
            .iter()
            .map(|&(ing, a)| (ing, (crafts * a as u64).saturating_sub(inv.get(&ing).copied().unwrap_or(0))))
            .find(|(_, s)| *s > 0)
            .unwrap();
        let mut obs = lang.obs(&["err", "need"]);
        obs.extend(lang.item_count(ing, short));
        StepOutput::observe(obs)
    }
}

impl Episode for TextCraftEpisode {
    fn vocab(&self) -> &Vocab {
        &self.world.vocab
    }

    fn root_goal(&self) -> Vec<Tok> {
        self.lang().item_count(self.task.target, self.task.count as u64)
    }

    fn prompt(&self, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok> {
        let v = &self.world.vocab;
        let mode = v.id(if recursive { "<rec>" } else { "<flat>" });
        let d = v.id(&format!("@{}", depth.min(MAX_DEPTH_TOKEN)));
        [vec![BOS, mode, d], goal.to_vec()].concat()
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
            Action::Craft(i, n) => self.craft(i, n),
            Action::Inv => {
                let inv = self.inventory.lock().unwrap();
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
            Action::Finish => StepOutput { step: Step::Finish, counters: vec![], result: None },
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

    /// 1 iff the node finished and its subtree crafted at least the goal's units of the target.
    /// (Units crafted by the subtree, not held-count deltas: siblings share the inventory and
    /// may legitimately consume each other's products while they run concurrently.)
    fn verify(&self, goal: &[Tok], finished: bool, _result: Option<&str>, subtree: &BTreeMap<String, i64>) -> f64 {
        verify_goal(&self.world, goal, finished, subtree)
    }
}

/// The TextCraft verifier as a pure function (the judge stage recomputes scores with it).
pub fn verify_goal(world: &World, goal: &[Tok], finished: bool, subtree: &BTreeMap<String, i64>) -> f64 {
    let Some((item, n)) = Lang::new(world).parse_goal(goal) else { return 0.0 };
    let made = subtree.get(&world.item(item).name).copied().unwrap_or(0);
    if finished && made >= n as i64 { 1.0 } else { 0.0 }
}
