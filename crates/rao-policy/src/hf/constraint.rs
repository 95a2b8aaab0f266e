//! Constrained decoding over a tokenizer's own vocabulary. An environment's action language in
//! text (`Grammar::lark`) is compiled by llguidance — the library vLLM and SGLang use — into token
//! masks, behind the same `Grammar` trait that the sampler and the loss apply: sampling and
//! training mask the same tokens, and every action sampled under it parses.

use parking_lot::Mutex;
use std::collections::HashMap;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use rao_envs::grammar::Grammar;
use rao_envs::vocab::Tok;

/// Matchers kept for recently seen prefixes: a decoding step extends the last step's prefix by
/// one token, so each step consumes one token instead of the whole prefix.
const CACHE_LIMIT: usize = 4096;

/// An action grammar over a model's token ids; the model's stop token ends an action.
pub struct TextGrammar {
    /// Matchers at the start of a flat (0) and a recursive (1) node's action.
    start: [Mutex<Matcher>; 2],
    cache: Mutex<HashMap<(bool, Vec<Tok>), Matcher>>,
    stop: Tok,
    /// Ids the model has output rows for.
    rows: usize,
}

impl TextGrammar {
    /// `token_bytes` from the tokenizer (`TextTokenizer::token_bytes`), `stop` the token that
    /// ends an assistant turn, `rows` the model's vocabulary size, and the Lark grammars of a
    /// flat and a recursive node's actions.
    pub fn new(mut token_bytes: Vec<Vec<u8>>, stop: Tok, rows: usize, flat: &str, recursive: &str) -> anyhow::Result<Self> {
        anyhow::ensure!((stop as usize) < rows, "the stop token {stop} lies outside the model's {rows} ids");
        let size = token_bytes.len().max(rows);
        token_bytes.resize(size, Vec::new());
        let info = TokRxInfo::new(size as u32, stop);
        let env: TokEnv = std::sync::Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &token_bytes)));
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        let matcher = |lark: &str| -> anyhow::Result<Mutex<Matcher>> {
            let m = Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(lark.to_string())));
            match m.get_error() {
                Some(e) => anyhow::bail!("the action grammar does not compile: {e}"),
                None => Ok(Mutex::new(m)),
            }
        };
        Ok(TextGrammar { start: [matcher(flat)?, matcher(recursive)?], cache: Mutex::new(HashMap::new()), stop, rows })
    }

    /// The stop token that ends an action.
    pub fn stop(&self) -> Tok {
        self.stop
    }

    /// A matcher that has consumed `prefix`, or `None` if the prefix leaves the grammar.
    fn matcher_after(&self, recursive: bool, prefix: &[Tok]) -> Option<Matcher> {
        let from_cache = prefix.split_last().and_then(|(&last, head)| {
            let cache = self.cache.lock();
            cache.get(&(recursive, head.to_vec())).map(|m| (m.deep_clone(), last))
        });
        let m = match from_cache {
            Some((mut m, last)) => {
                m.consume_token(last).ok()?;
                m
            }
            None => {
                let mut m = self.start[usize::from(recursive)].lock().deep_clone();
                m.consume_tokens(prefix).ok()?;
                m
            }
        };
        (!m.is_error()).then(|| {
            let mut cache = self.cache.lock();
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.insert((recursive, prefix.to_vec()), m.deep_clone());
            m
        })
    }
}

impl Grammar for TextGrammar {
    fn allowed(&self, recursive: bool, _context: &[Tok], prefix: &[Tok]) -> Vec<Tok> {
        let mut out = Vec::new();
        if let Some(mask) = self.matcher_after(recursive, prefix).and_then(|mut m| m.compute_mask().ok()) {
            mask.iter_set_entries(|i| {
                if i < self.rows {
                    out.push(i as Tok)
                }
            });
        }
        // Off the grammar (a sequence sampled under another mask): only the stop token.
        if out.is_empty() { vec![self.stop] } else { out }
    }
}
