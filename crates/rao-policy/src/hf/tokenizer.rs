//! A checkpoint's tokenizer (`tokenizer.json`, through Hugging Face's own `tokenizers` crate) and
//! its special tokens (`tokenizer_config.json`).

use std::path::Path;

use serde_json::Value;

use super::chat::ChatTemplate;
use super::files::{locate, parse_json, read_text};

/// The largest `tokenizer.json` read.
const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// The text of a tokenizer's files, as a checkpoint directory or artifact holds them.
#[derive(Debug, Clone, Default)]
pub struct TokenizerFiles {
    /// `tokenizer.json`
    pub tokenizer: String,
    /// `tokenizer_config.json` (special tokens, the chat template)
    pub config: Option<String>,
    /// `chat_template.jinja` (where the template is not in the config)
    pub chat_template: Option<String>,
}

/// GPT-2's split into words, then bytes; or, with `across_words`, single capital letters and
/// words that end in digits (`t3`, `12`; with the space before them) kept apart — what
/// environments name things with, so a name is the same tokens wherever it appears — and
/// everything between free to merge.
fn pre_tokenizer(across_words: bool) -> anyhow::Result<tokenizers::PreTokenizerWrapper> {
    use tokenizers::SplitDelimiterBehavior::Isolated;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::{sequence::Sequence, split::Split, split::SplitPattern};
    Ok(match across_words {
        false => ByteLevel::new(false, true, true).into(),
        true => {
            let names = Split::new(SplitPattern::Regex(r"\s?\b\p{Lu}\b|\s?\p{Ll}*\d+".into()), Isolated, false)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Sequence::new(vec![names.into(), ByteLevel::new(false, true, false).into()]).into()
        }
    })
}

/// The longest token (in characters) a BPE whose merges cross words may make.
const MAX_MERGED_TOKEN: usize = 256;

impl TokenizerFiles {
    /// The files of a checkpoint directory (`tokenizer.json` required).
    pub fn read(dir: &Path) -> anyhow::Result<TokenizerFiles> {
        let optional = |name: &str, limit: u64| -> anyhow::Result<Option<String>> {
            let path = dir.join(name);
            if path.exists() { Ok(Some(read_text(&path, limit)?)) } else { Ok(None) }
        };
        Ok(TokenizerFiles {
            tokenizer: read_text(&dir.join("tokenizer.json"), MAX_TOKENIZER_BYTES)?,
            config: optional("tokenizer_config.json", MAX_TOKENIZER_BYTES)?,
            chat_template: optional("chat_template.jinja", 1 << 20)?,
        })
    }

    /// A byte-level BPE tokenizer (GPT-2's byte alphabet, so any text encodes) of `vocab_size`
    /// ids trained on `corpus` with Hugging Face's trainer, `special` tokens first; `config` is
    /// its `tokenizer_config.json` (special tokens, chat template).
    /// A byte-level BPE of `vocab_size` tokens trained on `corpus`. `across_words` lets merges
    /// cross spaces and punctuation (SentencePiece's `split_by_whitespace: false`), never digits:
    /// text that recurs whole in the corpus — an environment's instructions, in every
    /// conversation — becomes a few long tokens instead of one or more per word, while numbers
    /// (item names, counts) stay tokens of their own, the same wherever they appear.
    pub fn train_bpe(
        corpus: &[String],
        vocab_size: usize,
        special: &[&str],
        config: Value,
        across_words: bool,
    ) -> anyhow::Result<TokenizerFiles> {
        use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::{DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper};
        let mut tokenizer =
            tokenizers::TokenizerBuilder::<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>::new()
                .with_model(BPE::default())
                .with_pre_tokenizer(Some(pre_tokenizer(across_words)?))
                .with_decoder(Some(ByteLevel::default().into()))
                .build()
                .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            // The constraint library's token trie takes tokens of up to 1,024 bytes; words never
            // come near that, merges across them would (the instructions, whole).
            .max_token_length(across_words.then_some(MAX_MERGED_TOKEN))
            .show_progress(false)
            .special_tokens(special.iter().map(|s| tokenizers::AddedToken::from(*s, true)).collect())
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        tokenizer.train(&mut trainer, corpus.iter()).map_err(|e| anyhow::anyhow!("training the tokenizer: {e}"))?;
        let tokenizer: tokenizers::Tokenizer = tokenizer.into();
        Ok(TokenizerFiles {
            tokenizer: tokenizer.to_string(true).map_err(|e| anyhow::anyhow!("writing the tokenizer: {e}"))?,
            config: Some(serde_json::to_string_pretty(&config)?),
            chat_template: None,
        })
    }

    /// The files' names and contents, as they are written next to a checkpoint.
    pub fn named(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("tokenizer.json", self.tokenizer.as_str())];
        out.extend(self.config.as_deref().map(|c| ("tokenizer_config.json", c)));
        out.extend(self.chat_template.as_deref().map(|c| ("chat_template.jinja", c)));
        out
    }
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// The files as read: written next to every checkpoint of the model, and the constraint
    /// library takes each token's bytes from `tokenizer.json`.
    files: TokenizerFiles,
    /// `bos_token` / `eos_token` of `tokenizer_config.json`, as text.
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The chat template (`tokenizer_config.json`'s `chat_template`, or `chat_template.jinja`).
    pub chat: Option<ChatTemplate>,
}

impl TextTokenizer {
    /// Reads `tokenizer.json` and, when present, `tokenizer_config.json` and `chat_template.jinja`.
    pub fn load(dir: &Path) -> anyhow::Result<TextTokenizer> {
        TextTokenizer::from_files(TokenizerFiles::read(dir)?, &|name| dir.join(name).display().to_string())
    }

    /// A tokenizer from the contents of its files; `name_of(file)` says where each came from (for
    /// errors).
    pub fn from_files(files: TokenizerFiles, name_of: &dyn Fn(&str) -> String) -> anyhow::Result<TextTokenizer> {
        let (text, config, chat_template) = (&files.tokenizer, files.config.clone(), files.chat_template.clone());
        let inner: tokenizers::Tokenizer =
            text.parse().map_err(|e| anyhow::anyhow!("{}: not a readable tokenizer ({e})", name_of("tokenizer.json")))?;
        let mut tok = TextTokenizer { inner, files: TokenizerFiles::default(), bos_token: None, eos_token: None, chat: None };
        if let Some(config_text) = config {
            let config = std::path::PathBuf::from(name_of("tokenizer_config.json"));
            let cfg: Value = parse_json(&config, &config_text)?;
            let text = config_text;
            let token = |key: &str| -> anyhow::Result<Option<String>> {
                match cfg.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(Value::Object(o)) => match o.get("content") {
                        Some(Value::String(s)) => Ok(Some(s.clone())),
                        _ => anyhow::bail!("{}: `{key}` needs a `content` string", locate(&config, &text, key)),
                    },
                    Some(_) => anyhow::bail!("{}: `{key}` must be a string", locate(&config, &text, key)),
                }
            };
            tok.bos_token = token("bos_token")?;
            tok.eos_token = token("eos_token")?;
            let template = match cfg.get("chat_template") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: the one called "default".
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(str::to_string),
                Some(_) => anyhow::bail!("{}: `chat_template` must be a string", locate(&config, &text, "chat_template")),
            };
            if let Some(t) = template {
                tok.chat = Some(
                    ChatTemplate::new(t, tok.bos_token.clone(), tok.eos_token.clone())
                        .map_err(|e| anyhow::anyhow!("{}: {e}", locate(&config, &text, "chat_template")))?,
                );
            }
        }
        if let (None, Some(source)) = (&tok.chat, chat_template) {
            tok.chat = Some(
                ChatTemplate::new(source, tok.bos_token.clone(), tok.eos_token.clone())
                    .map_err(|e| anyhow::anyhow!("{}: {e}", name_of("chat_template.jinja")))?,
            );
        }
        tok.files = files;
        Ok(tok)
    }

    /// Token ids of `text` (with the tokenizer's own special tokens, e.g. a leading BOS, when
    /// `add_special_tokens`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> anyhow::Result<Vec<u32>> {
        Ok(self.inner.encode(text, add_special_tokens).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> anyhow::Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| anyhow::anyhow!("detokenizing: {e}"))
    }

    /// The id of a token (added or special tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The bytes each id stands for (special tokens marked as llguidance marks them), for
    /// constrained decoding. Byte-level and byte-fallback tokenizers have them.
    pub fn token_bytes(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        let json: serde_json::Value = serde_json::from_str(&self.files.tokenizer)?;
        // The library asserts on malformed byte-fallback names; the file is untrusted input.
        std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| anyhow::anyhow!("tokenizer.json: a token's name is not a byte of its byte-fallback vocabulary"))?
            .map_err(|e| anyhow::anyhow!("tokenizer.json: {e} (constrained decoding needs a byte-level or byte-fallback tokenizer)"))
    }

    /// `tokenizer.json` as read.
    pub fn source(&self) -> &str {
        &self.files.tokenizer
    }

    /// The files it was read from (what a checkpoint of the model carries along).
    pub fn files(&self) -> &TokenizerFiles {
        &self.files
    }

    /// Number of ids (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
